"""Shared fixtures: alice (admin), bob (member of team vision), charlie (member of another team),
a small cluster of fake a10g nodes, and a share per strategy."""

from pathlib import Path

import pytest
from django.core.cache import cache

from gpunodes.services import fake_inventory, node_register
from quotas import engine
from quotas.choices import Role, Strategy
from quotas.models import Membership, Share, ShareCapacity, Team

# `make test` runs the tests in two parts: the in-process ones on two pytest-xdist workers (`-m "not
# serial"`), then, one at a time, those marked `serial` here: they start real agents, workers, brokers or
# a browser, cut networks, hold real time or time themselves against a limit, and must not share the
# machine's two cores with another test. Every test is in exactly one part.
SERIAL_DIRS = {"browser", "containers", "faults", "gpunodes", "live", "security"}
SERIAL_FILES = {
    "test_filebroker.py",
    "test_procman.py",
    "test_readme.py",
    "test_redisbroker.py",
    "test_redisbroker_outage.py",
}
# Of those directories, the files that run in-process all the same (request and page matrices, the
# agent's pure parts): in the first part. A new file of a serial directory is serial until listed here.
IN_PROCESS_FILES = {
    "gpunodes/test_fake_gpu_fault_resume.py",
    "gpunodes/test_gpu_health.py",
    "gpunodes/test_heartbeat.py",
    "gpunodes/test_host_log_bounds.py",
    "gpunodes/test_inventory.py",
    "gpunodes/test_private_tmp_paths.py",
    "gpunodes/test_unconfirmed_stops.py",
    "security/test_audit_log.py",
    "security/test_bounded_answers.py",
    "security/test_checkpoint_links.py",
    "security/test_grace_cap_and_cancel.py",
    "security/test_heartbeat_order.py",
    "security/test_isolation.py",
    "security/test_job_input.py",
    "security/test_join_requests.py",
    "security/test_login_lockout.py",
    "security/test_logins.py",
    "security/test_message_signing.py",
    "security/test_node_messages_bound.py",
    "security/test_nodes_page_privacy.py",
    "security/test_page_matrix.py",
    "security/test_permission_matrix.py",
}
TESTS = Path(__file__).resolve().parent
# A compiled engine's classes and functions cannot be patched (quotas/engine/native.py): the tests that
# patch them run in make test's own pass with GPUQUOTA_ENGINE=python, and are skipped here when compiled.
ENGINE_COMPILED = engine.COMPILED
AS_PYTHON = "patches the engine's insides: runs in make test's pass with GPUQUOTA_ENGINE=python"


@pytest.hookimpl(tryfirst=True)  # (before -m deselects by marker)
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath)).resolve()
        parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
        if (
            (len(parts) > 1 and parts[0] in SERIAL_DIRS and "/".join(parts) not in IN_PROCESS_FILES)
            or path.name in SERIAL_FILES
            or item.get_closest_marker("live")
            or item.get_closest_marker("browser")
        ):
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("engine_as_python") and ENGINE_COMPILED:
            item.add_marker(pytest.mark.skip(reason=AS_PYTHON))


@pytest.fixture(autouse=True)
def own_submit_cache(monkeypatch):
    """Each test its own keys for the submit cache (jobs.submit_cache): a rolled-back test fires no
    signals, so what it cached must not be seen by the next one."""
    import uuid

    from jobs import submit_cache

    monkeypatch.setattr(submit_cache, "PREFIX", f"gpuquota:test:{uuid.uuid4().hex}:")


@pytest.fixture(autouse=True)
def own_submit_coalescer(monkeypatch):
    """Each test its own submit coalescer (quotas.triggers), settled when the test ends (below): a
    trailing request a test's submits started must not fire into the next test, where it would run a
    pass on a thread of its own beside that test's (and a flush of the test database under it fails)."""
    from quotas import triggers

    coalescer = triggers._Coalescer()
    monkeypatch.setattr(triggers, "_coalescer", coalescer)
    return coalescer


@pytest.fixture(autouse=True)
def organisation_read_every_time():
    """No organisation reused between requests (quotas.organisation.load_recent) unless a test asks:
    a test that changes the cluster and reads it again within ORGANISATION_RECENT_S must see it. (Not
    pytest-django's `settings` fixture: some tests have a parameter of that name.)"""
    from django.test import override_settings

    from quotas import organisation

    organisation.forget_recent()
    with override_settings(ORGANISATION_RECENT_S=0):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    """Settle the test's coalescer before any fixture is torn down: a fixture's finalizer runs after
    those set up later, and the test database (flushed by transactional_db's) is set up later than an
    autouse fixture of this file."""
    from quotas import triggers

    triggers._coalescer.settle()
    yield


@pytest.fixture
def no_messages(monkeypatch, settings):
    """Nothing goes to Celery: tasks sent and passes asked for are recorded instead. A local cache and
    a fast hasher (the tests log in a lot, and PBKDF2 is slow on purpose). The API, web and CLI tests
    use it for every test."""
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()
    return sent


@pytest.fixture
def celery_eager():
    """Celery tasks run at once, in the process that sends them (CELERY_TASK_ALWAYS_EAGER): the
    what-if's replays answer within the request."""
    from config.celery import app

    was = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = was


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_superuser("alice", "alice@example.com", "alice-pw-123")


@pytest.fixture
def vision(db):
    return Team.objects.create(name="Vision", slug="vision")


@pytest.fixture
def language(db):
    return Team.objects.create(name="Language", slug="language")


@pytest.fixture
def bob(django_user_model, vision):
    user = django_user_model.objects.create_user("bob", "bob@example.com", "bob-pw-123")
    Membership.objects.create(team=vision, user=user, role=Role.MEMBER)
    return user


@pytest.fixture
def charlie(django_user_model, language):
    user = django_user_model.objects.create_user("charlie", "charlie@example.com", "charlie-pw-123")
    Membership.objects.create(team=language, user=user, role=Role.MEMBER)
    return user


@pytest.fixture
def nodes(db):
    """Two READY 4-GPU a10g nodes."""
    return [
        node_register(name=name, gpu_type="a10g", gpus=fake_inventory(name, 4))[0]
        for name in ("node-1", "node-2")
    ]


def make_share(team, name, *, capacity=None, strategy=Strategy.LEND_AND_BORROW, **kwargs) -> Share:
    share = Share.objects.create(team=team, name=name, strategy=strategy, **kwargs)
    for gpu_type, n in (capacity or {}).items():
        ShareCapacity.objects.create(share=share, gpu_type=gpu_type, max_gpus=n)
    return share


@pytest.fixture
def vision_share(vision):
    return make_share(vision, "vision-main", capacity={"a10g": 4})


@pytest.fixture
def language_share(language):
    return make_share(language, "language-main", capacity={"a10g": 2}, strategy=Strategy.LEND)


def heard_all_along(hours: float = 1.0) -> None:
    """Record a pass that has heard heartbeats for `hours`: a silent node may then be declared LOST at
    once (quotas/hearing.py), as on a cluster that has been up a while."""
    from datetime import timedelta

    from django.utils import timezone

    from quotas.models import SchedulerPass

    now = timezone.now()
    SchedulerPass.objects.create(started_at=now, hearing_since=now - timedelta(hours=hours))
