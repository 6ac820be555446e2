"""Registry credentials are the admin's: an auth file on the host, root's and readable by nobody else,
given to podman with --authfile (and to the manifest request that sizes the pull). A real docker-registry
with htpasswd (bcrypt) auth: without the file the pull fails with the registry's reason; with it the job
runs, and the password is in none of the job's environment, its log, the reports sent to the control
side or the agent's own log. A file others may read is refused in words."""

from __future__ import annotations

import base64
import json
import logging
import warnings

import pytest

from gpunodes.agent.containers import Podman, authfile_problem
from gpunodes.agent.runner import PULLING
from tests.containers.conftest import insecure_registries, needs_podman, serve_registry
from tests.security.agent_helpers import make_runner, uid_pool, wait_until

pytestmark = needs_podman

USER, PASSWORD = "team-ci", "s3cret-pa55word"


def bcrypt_line(user: str, password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt
        except ImportError:
            pytest.skip("no crypt module to make an htpasswd line")
    if crypt.METHOD_BLOWFISH not in crypt.methods:
        pytest.skip("this libc's crypt makes no bcrypt hashes (docker-registry's htpasswd needs them)")
    return f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n"


@pytest.fixture
def private_registry(podman, image, tmp_path, monkeypatch):
    """A registry that asks for a password, holding the test image as team/private:1."""
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(bcrypt_line(USER, PASSWORD))
    (tmp_path / "reg").mkdir()
    proc, address = serve_registry(tmp_path / "reg", htpasswd)
    monkeypatch.setenv(
        "CONTAINERS_REGISTRIES_CONF", str(insecure_registries(tmp_path / "registries.conf", address))
    )
    pushed = f"{address}/team/private:1"
    podman._run("tag", image, pushed)
    r = podman._run("push", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}", pushed)
    assert r.returncode == 0, r.stderr
    podman._run("rmi", pushed)
    yield pushed, address
    podman._run("rmi", "-f", pushed)
    proc.terminate()
    proc.wait(10)


def test_a_pull_uses_the_admins_auth_file_and_the_password_shows_nowhere(
    root_dir, reports, podman, private_registry, caplog
):
    pushed, address = private_registry
    caplog.set_level(logging.INFO)
    # Without credentials: the registry's reason, once.
    bare = Podman(podman.path, podman.runtime, podman.cgroups, None)
    first = make_runner(root_dir, reports, uids=uid_pool(), podman=bare)
    try:
        assert first.start(attempt_id=1, number=1, job_id=7, command=["true"], image=pushed) == "failed"
        detail = reports.finished(1)["detail"]
        assert detail.startswith(f"could not pull image {pushed}: ") and "authentication required" in detail
    finally:
        first.shutdown(grace_s=1)
    # With the admin's file (root's, 0600).
    auth = root_dir / "registry-auth.json"
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    auth.write_text(json.dumps({"auths": {address: {"auth": token}}}))
    auth.chmod(0o600)
    withauth, why = Podman.detect(authfile=str(auth))
    assert withauth is not None, why
    runner = make_runner(root_dir, reports, uids=uid_pool(), podman=withauth)
    try:
        script = "env; cat /proc/self/environ; ls -la / /run 2>&1"
        assert (
            runner.start(attempt_id=2, number=1, job_id=8, command=[script], use_shell=True, image=pushed)
            == "started"
        )
        done = wait_until(lambda: reports.finished(2), timeout=60, runner=runner, what="the private job")
        assert done["how"] == "exited" and done["exit_code"] == 0, reports.log_of(2)
        said = [k["text"] for k in reports.of(PULLING) if k["attempt_id"] == 2]
        assert " of " in said[0], said  # the manifest was read with the same credentials: a total
        everything = json.dumps(list(reports)) + caplog.text
        for secret in (PASSWORD, token):
            assert secret not in everything, secret
        env_files = list((runner.state_path.parent / "containers").glob("*.env"))
        assert all(PASSWORD not in f.read_text() and token not in f.read_text() for f in env_files)
    finally:
        runner.shutdown(grace_s=1)
        for name, _ in podman.containers(runner.node):
            podman.remove(name)


def test_an_auth_file_others_may_read_is_refused_in_words(tmp_path):
    auth = tmp_path / "auth.json"
    auth.write_text("{}")
    auth.chmod(0o644)
    podman, why = Podman.detect(authfile=str(auth))
    assert podman is None
    assert (
        why.startswith(f"the registry credentials file {auth} must be the agent's own") and "chmod 600" in why
    )
    auth.chmod(0o600)
    assert authfile_problem(str(auth)) == ""
    link = tmp_path / "link.json"
    link.symlink_to(auth)
    assert "is not a plain file" in authfile_problem(str(link))
    assert "cannot be read" in authfile_problem(str(tmp_path / "missing.json"))


def test_the_credentials_of_a_registry_are_found_by_its_name_or_address(tmp_path):
    from gpunodes.agent.containers import _credentials

    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps(
            {
                "auths": {
                    "127.0.0.1:5000": {"auth": "bG9jYWw="},
                    "https://index.docker.io/v1/": {"auth": "aHVi"},
                    "ghcr.io": {"auth": "Z2hjcg=="},
                }
            }
        )
    )
    assert _credentials("127.0.0.1:5000", str(auth)) == "bG9jYWw="
    assert _credentials("docker.io", str(auth)) == "aHVi"
    assert _credentials("ghcr.io", str(auth)) == "Z2hjcg=="
    assert _credentials("quay.io", str(auth)) is None
    assert _credentials("ghcr.io", None) is None
