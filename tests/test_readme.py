"""The README says what `make run` and the tests really do: where screenshots go, the demo process
and how to leave it out."""

import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_says_where_browser_screenshots_go():
    from tests.browser import conftest

    assert Path(settings.VAR_DIR) / "screenshots" == conftest.SCREENSHOTS
    assert "`$GPUQUOTA_VAR_DIR/screenshots/` (`var/test/screenshots/` with `make test`)" in README


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_run_demo_0_leaves_the_demo_process_out_as_the_readme_says():
    assert "`demo`" in README and "`make run DEMO=0`" in README
    procfile = (ROOT / "Procfile.dev").read_text()
    assert any(line.startswith("demo:") for line in procfile.splitlines())
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run", "DEMO=0"], cwd=ROOT, capture_output=True, text=True
    )
    assert "config.procman Procfile.dev --without demo" in dry.stdout
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run"], cwd=ROOT, capture_output=True, text=True
    )
    assert "--without demo" not in dry.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_run_port_changes_the_web_servers_port_as_the_readme_says():
    assert "`make run PORT=8080`" in README
    dry = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "run", "PORT=8080"], cwd=ROOT, capture_output=True, text=True
    )
    assert "PORT=8080 " in dry.stdout and "http://127.0.0.1:8080/" in dry.stdout
    web = next(line for line in (ROOT / "Procfile.dev").read_text().splitlines() if line.startswith("web:"))
    shown = subprocess.run(
        ["/bin/sh", "-c", f"echo {web.split(':', 1)[1]}"],
        env={"PORT": "8080"},
        capture_output=True,
        text=True,
    )
    assert "127.0.0.1:8080 " in shown.stdout


def test_the_readmes_module_commands_run_as_written_from_the_checkout(tmp_path):
    """`python -m quotas.…` finds `quotas` only from the checkout with the venv's Python: the README
    gives `.venv/bin/python -m` and says so; its commands then work as written."""
    import re
    import sys

    assert not re.findall(r"(?<!\.venv/bin/)python -m quotas\.", README)
    assert "Run them from the checkout (the directory of this README) with the venv's Python" in README
    trace = tmp_path / "scenario.json"
    with trace.open("w") as out:
        made = subprocess.run(
            [sys.executable, "-m", "quotas.tracegen", "--teams", "2", "--gpus", "16", "--jobs", "20"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert made.returncode == 0, made.stderr
    simulated = subprocess.run(
        [sys.executable, "-m", "quotas.simulate", str(trace), "--out", str(tmp_path / "result.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert simulated.returncode == 0, simulated.stderr
    assert (tmp_path / "result.json").exists()
