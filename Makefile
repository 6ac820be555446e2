# gpuquota: `make run` sets everything up and starts the product; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run setup engine test test-fast lint format bench migrate clean

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	touch $(STAMP)

# The engine compiled (quotas/engine/native.py): the same sources, 2-3x faster replays. Where no C
# compiler is at hand it says so and the engine runs as Python (the same decisions). Built again only
# when its sources change; GPUQUOTA_ENGINE=python turns it off for a process.
engine: $(STAMP)
	$(BIN)/python -m quotas.engine.build_native build --optional

setup: $(STAMP) engine
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	$(BIN)/python manage.py ensure_admin

# Web, control worker, beat, two simulated GPU hosts and the demo traffic (DEMO=0: without it) on SQLite
# and the file broker. A process that dies is restarted; Ctrl-C stops all (config/procman.py).
# The web server's port: `make run PORT=8080` (Procfile.dev reads it).
DEMO ?= 1
PORT ?= 8000
run: setup
	@echo "gpuquota on http://127.0.0.1:$(PORT)/  (admin at /admin/)"
	@$(BIN)/python manage.py credentials --url http://127.0.0.1:$(PORT)/login/
	GPUQUOTA_MAKE_RUN=1 PORT=$(PORT) PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m config.procman Procfile.dev $(if $(filter 0,$(DEMO)),--without demo)

# The tests keep their files (broker, logs, agent state) apart from a `make run` in the same checkout.
# The in-process tests run on two workers (each its own files, databases: config/settings.py), then the
# `serial` ones (real processes, networks, a browser, time limits: tests/conftest.py) one at a time.
# One part, one file or a -k: `make test PYTEST_ARGS="tests/quotas -k victims"` (then in one process).
# With the engine compiled, the few tests that patch its insides (`engine_as_python`) run apart, as Python.
TEST_WORKERS ?= 2
test: $(STAMP) engine
ifeq ($(strip $(PYTEST_ARGS)),)
	export GPUQUOTA_VAR_DIR=$(CURDIR)/var/test; failed=0; \
	$(BIN)/python -m pytest -m "not serial" -n $(TEST_WORKERS) || failed=1; \
	if $(BIN)/python -c "import sys, quotas.engine as e; sys.exit(not e.COMPILED)"; then \
	  GPUQUOTA_ENGINE=python $(BIN)/python -m pytest -m "engine_as_python and not serial" || failed=1; fi; \
	$(BIN)/python -m pytest -m serial || failed=1; \
	exit $$failed
else
	GPUQUOTA_VAR_DIR=$(CURDIR)/var/test $(BIN)/python -m pytest $(PYTEST_ARGS)
endif

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf var/broker var/cache var/test.sqlite3 build/engine.*
