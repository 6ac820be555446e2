"""Container jobs with real parts: podman (with the runtime that works on this host), images built here
from the host's static busybox (`podman import` of a small root filesystem: no network), a real registry
(Debian's docker-registry) on a free loopback port. Without podman, busybox or root these tests skip,
saying which is missing."""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import pytest

from gpunodes.agent.containers import Podman
from tests.security.agent_helpers import job_root, make_runner, uid_pool

BUSYBOX = shutil.which("busybox")
APPLETS = (
    "sh",
    "cat",
    "id",
    "ls",
    "sleep",
    "echo",
    "ps",
    "touch",
    "head",
    "dd",
    "tr",
    "grep",
    "stat",
    "kill",
)


def _static(path: str) -> bool:
    """No program interpreter named in its first pages: a static binary (an image of it alone runs)."""
    with open(path, "rb") as f:
        head = f.read(8192)
    return b"/ld-linux" not in head and b"/ld-musl" not in head


def _why_not() -> str:
    if os.geteuid() != 0:
        return "container jobs need a root agent (a uid per attempt)"
    if not shutil.which("podman"):
        return "podman is not installed (apt-get install podman runc)"
    if not BUSYBOX or not _static(BUSYBOX):
        return "no static busybox to build a test image from (apt-get install busybox-static)"
    podman, why = Podman.detect()
    return "" if podman else why


WHY_NOT = _why_not()
needs_podman = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "podman")


def rootfs_tar(path: Path, extra_bytes: int = 0) -> Path:
    """A root filesystem of busybox and its applets, an /etc/passwd and the empty directories a
    read-only container mounts over; `extra_bytes` of random data in /blob (a layer that does not
    compress: its download takes its size)."""
    with tarfile.open(path, "w") as tar:
        if extra_bytes:
            info = tarfile.TarInfo("blob")
            info.size = extra_bytes
            tar.addfile(info, io.BytesIO(os.urandom(extra_bytes)))
        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "run", "var", "var/tmp"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if "tmp" in d else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        for applet in APPLETS:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return path


@pytest.fixture(scope="session")
def podman():
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    return Podman.detect()[0]


@pytest.fixture(scope="session")
def image(podman, tmp_path_factory):
    """A local image (never pushed): `localhost/gpuquota-test/bb:<random>`, removed at the end."""
    name = f"localhost/gpuquota-test/bb:{uuid.uuid4().hex[:8]}"
    tar = rootfs_tar(tmp_path_factory.mktemp("rootfs") / "rootfs.tar")
    subprocess.run(
        [*podman.base(), "import", "--change", "ENV=PATH=/bin", tar, name], check=True, capture_output=True
    )
    yield name
    subprocess.run([*podman.base(), "rmi", "-f", name], capture_output=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_registry(root: Path, htpasswd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Debian's docker-registry on a free loopback port, storing under `root`, with Basic auth from an
    htpasswd file (bcrypt) where given: (its process, its address)."""
    exe = shutil.which("docker-registry")
    if not exe:
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
        f"{root / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
        + (f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n" if htpasswd else "")
    )
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.skip("docker-registry did not start")
    return proc, f"127.0.0.1:{port}"


def insecure_registries(path: Path, *addresses: str) -> Path:
    """A registries.conf that lets podman reach these registries over plain HTTP."""
    path.write_text("".join(f'[[registry]]\nlocation = "{a}"\ninsecure = true\n\n' for a in addresses))
    return path


@pytest.fixture(scope="session")
def registry(podman, tmp_path_factory):
    """Debian's docker-registry on a free loopback port, storing in a temporary directory: its
    address (127.0.0.1:PORT), which podman reaches over plain HTTP (a registries.conf of the test's own,
    through the environment)."""
    root = tmp_path_factory.mktemp("registry")
    proc, address = serve_registry(root)
    conf = insecure_registries(root / "registries.conf", address)
    old = os.environ.get("CONTAINERS_REGISTRIES_CONF")
    os.environ["CONTAINERS_REGISTRIES_CONF"] = str(conf)
    yield address
    if old is None:
        os.environ.pop("CONTAINERS_REGISTRIES_CONF", None)
    else:
        os.environ["CONTAINERS_REGISTRIES_CONF"] = old
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def root_dir():
    root = job_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def runner(root_dir, reports, podman):
    r = make_runner(root_dir, reports, uids=uid_pool(), podman=podman)
    r.node = f"ct{uuid.uuid4().hex[:6]}"  # its containers apart from other tests'
    yield r
    r.shutdown(grace_s=1)
    for name, _ in podman.containers(r.node):
        podman.remove(name)


@pytest.fixture
def reports():
    from tests.security.agent_helpers import Reports

    return Reports()
