"""Bench 14: how long a container job takes to start, against the same command on the host (issue 39).

Run as root on a host with podman, runc, busybox-static and docker-registry:
    .venv/bin/python bench/bench_container_start.py [--runs 7] [--payload-mb 300]
It builds a small image from busybox (no network), starts a local registry on a free port, and times,
through the agent's Runner (a uid per attempt, its cgroups, its directories), from start() to the
job's first line of output: a bare host command, the image pulled from the local registry first
(removed with its layers before each run), the image already cached. --payload-mb N adds a file of N MB
of random bytes to the image (a layer of that size to pull).

--pull-ab: instead, what the pull's byte counts cost: alternately a plain `podman pull` (as the agent
pulled before them) and the agent's Podman.pull (a manifest request, a thread that sums podman's
download files), the image and its layers removed before each."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--payload-mb", type=int, default=0, help="a file of this many random MB in the image"
    )
    parser.add_argument("--pull-ab", action="store_true", help="time pulls with and without the byte counts")
    args = parser.parse_args()
    import subprocess

    from gpunodes.agent.containers import Podman
    from tests.containers import conftest as ct
    from tests.security.agent_helpers import Reports, make_runner, uid_pool

    if ct.WHY_NOT:
        sys.exit(f"cannot bench containers here: {ct.WHY_NOT}")
    podman = Podman.detect()[0]
    work = Path(tempfile.mkdtemp(prefix="gpuquota-bench-", dir="/var/tmp"))
    work.chmod(0o711)
    image = f"localhost/gpuquota-bench/bb:{uuid.uuid4().hex[:6]}"
    tar = ct.rootfs_tar(work / "r.tar")
    if args.payload_mb:
        import tarfile

        payload = work / "payload"
        with open(payload, "wb") as f:
            for _ in range(args.payload_mb):
                f.write(os.urandom(1 << 20))
        with tarfile.open(tar, "a") as t:
            t.add(payload, "payload")
        payload.unlink()
    subprocess.run(
        [*podman.base(), "import", "--change", "ENV=PATH=/bin", tar, image],
        check=True,
        capture_output=True,
    )
    registry_gen = ct.registry.__wrapped__(podman, _Factory(work))
    registry = next(registry_gen)
    pushed = f"{registry}/bench/bb:1"
    podman._run("tag", image, pushed)
    podman._run("push", "--tls-verify=false", pushed)
    podman._run("rmi", image)  # only the registry's name is left: removing it removes its layers
    if args.pull_ab:
        try:
            pull_ab(podman, pushed, work, args.runs)
        finally:
            podman._run("rmi", "-f", image, pushed)
            next(registry_gen, None)
            shutil.rmtree(work, ignore_errors=True)
        return
    reports = Reports()
    runner = make_runner(work, reports, uids=uid_pool(), podman=podman, image_cache_bytes=0)
    runner.node = f"bench{uuid.uuid4().hex[:4]}"
    host_echo = shutil.which("echo", path="/usr/bin:/bin")
    # Pulled before cached: each round's pull leaves the image cached for the next run.
    results: dict[str, list[float]] = {"bare command": [], "image pulled": [], "image cached": []}
    attempt = 0
    try:
        for _ in range(args.runs):
            for what in results:
                attempt += 1
                if what == "image pulled":
                    podman._run("rmi", pushed)
                kw = {"image": pushed} if what != "bare command" else {}
                command = [host_echo if what == "bare command" else "echo", "first-line"]
                began = time.monotonic()
                runner.start(attempt_id=attempt, number=1, job_id=attempt, command=command, **kw)
                while "first-line" not in reports.log_of(attempt):
                    runner.poll()
                    time.sleep(0.005)
                results[what].append(time.monotonic() - began)
                while not reports.finished(attempt):
                    runner.poll()
                    time.sleep(0.01)
    finally:
        runner.shutdown(grace_s=1)
        podman._run("rmi", "-f", image, pushed)
        next(registry_gen, None)
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"{'start to first output line':<28} {'median s':>9} {'min s':>7} {'max s':>7}  (runs: {args.runs})"
    )
    for what, times in results.items():
        print(f"{what:<28} {statistics.median(times):>9.3f} {min(times):>7.3f} {max(times):>7.3f}")


def pull_ab(podman, pushed: str, work: Path, runs: int) -> None:
    import subprocess

    from gpunodes.agent import containers

    began = time.monotonic()
    layers = containers.registry_layers(pushed) or {}
    manifest_s = time.monotonic() - began
    plain, counted, said = [], [], []
    for _ in range(runs):
        podman._run("rmi", "-f", pushed, timeout=300)
        began = time.monotonic()
        subprocess.run(
            [*podman.base(), "pull", pushed], capture_output=True, env=containers.podman_env(), check=True
        )
        plain.append(time.monotonic() - began)
        podman._run("rmi", "-f", pushed, timeout=300)
        lines: list[str] = []
        began = time.monotonic()
        podman.pull(pushed, lambda line, progress=False, lines=lines: lines.append(line), tmp_root=work)
        counted.append(time.monotonic() - began)
        said.append(len(lines))
    print(
        f"pull of {sum(layers.values()) / 1e6:.1f} MB; the manifest request took {manifest_s * 1000:.0f} ms"
    )
    print(f"{'pull':<28} {'median s':>9} {'min s':>7} {'max s':>7}  (runs: {runs})")
    for what, times in (("plain podman pull", plain), ("with byte counts", counted)):
        print(f"{what:<28} {statistics.median(times):>9.3f} {min(times):>7.3f} {max(times):>7.3f}")
    print(f"lines said per pull: {said}")


class _Factory:
    def __init__(self, root: Path) -> None:
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / f"{name}-{uuid.uuid4().hex[:4]}"
        path.mkdir()
        return path


if __name__ == "__main__":
    import django

    django.setup()
    main()
