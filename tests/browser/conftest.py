"""Browser tests: Playwright (sync API) driving Debian's headless Chromium against pytest-django's
live_server. Skipped when Playwright or /usr/bin/chromium is missing (.ci/run installs both).
Screenshots of each page are saved under var/screenshots/ as test artifacts."""

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.signals import request_finished, request_started

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = Path(settings.VAR_DIR) / "screenshots"
PASSWORD = "browser-pw-123"

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def chromium():
    if not shutil.which(CHROMIUM):
        if os.environ.get("GPUQUOTA_REQUIRE_BROWSER"):  # CI: a missing browser is a failure, not a skip
            pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    # Playwright's sync API keeps an event loop running in the test thread while the browser is open;
    # the ORM calls the tests (and the database flush between them) make are still plain synchronous
    # code. Allowed only while this module's browser is open, never for the rest of the session.
    with pytest.MonkeyPatch.context() as mp, sync_api.sync_playwright() as pw:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture(autouse=True)
def quiet(monkeypatch, settings):
    """Nothing goes to Celery; a fast password hasher; a fresh in-memory cache."""
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: None)
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": False)
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()


class InFlight:
    """Requests the live server is still answering. A page closed while a request is on its way (an htmx
    poll, a what-if preview) leaves the server thread in a transaction after the test: the database
    flush between tests (TRUNCATE) then deadlocks with it on PostgreSQL, and the next test finds the
    last one's rows. The browser fixtures wait for these to end before the flush."""

    def __init__(self) -> None:
        self.count = 0
        self.cond = threading.Condition()
        request_started.connect(self.started, dispatch_uid="tests.browser.inflight.started")
        request_finished.connect(self.finished, dispatch_uid="tests.browser.inflight.finished")

    # Only the live server's threads count: the test client answers on the test's own thread, and a
    # view that raises there (a test that expects it) never sends request_finished.
    def started(self, **kwargs) -> None:
        if threading.current_thread() is not threading.main_thread():
            with self.cond:
                self.count += 1

    def finished(self, **kwargs) -> None:
        if threading.current_thread() is not threading.main_thread():
            with self.cond:
                self.count -= 1
                self.cond.notify_all()

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self.count > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(
                        f"the live server still answers {self.count} request(s) {timeout_s:.0f} s after the test"
                    )
                self.cond.wait(left)


IN_FLIGHT = InFlight()


def close_and_settle(context) -> None:
    """Close a browser context, then wait until the live server has answered what it sent."""
    context.close()
    IN_FLIGHT.wait_idle()


@pytest.fixture
def page(chromium, live_server):
    context = chromium.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(10_000)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    close_and_settle(context)
    assert not errors, f"JavaScript errors: {errors}"


def login(page, user):
    user.set_password(PASSWORD)
    user.save()
    page.goto("/login/")
    page.get_by_label("Username").fill(user.get_username())
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


@pytest.fixture
def whatif_worker(monkeypatch, transactional_db):
    """The what-if's replay tasks, each in a thread of its own as a worker would run it, once the
    returned gate is set (it starts set). The threads are waited for before the database is flushed: a
    replay that a second preview replaced still reads it, and on a loaded machine it outlived its test
    and the flush failed under it (and the tests after it met the rows it left)."""
    from django.db import connection

    from quotas import whatif

    gate = threading.Event()
    gate.set()
    real_replay = whatif.replay
    threads: list[threading.Thread] = []

    def held_replay(*args, **kwargs):
        assert gate.wait(30), "the test never let the replays go"
        return real_replay(*args, **kwargs)

    def run(run_id, index):
        try:
            whatif.run_part(run_id, index, isolated=False)
        finally:
            connection.close()

    def enqueue(run_id, index):
        thread = threading.Thread(target=run, args=(run_id, index), daemon=True)
        threads.append(thread)
        thread.start()

    monkeypatch.setattr(whatif, "replay", held_replay)
    monkeypatch.setattr(whatif, "_enqueue", enqueue)
    yield gate
    gate.set()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a replay thread outlived its test by 2 minutes"
