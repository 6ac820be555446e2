"""A pull says its bytes as they arrive ("pulling image X, 12.0 of 24.1 MB"): the total from the
registry's manifest, the bytes from podman's own download files. A real registry behind a real TCP
proxy that slows its answers to a few MB/s (over loopback a pull would be over before a second report);
the image holds a 24 MB layer of random bytes (it does not compress)."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from gpunodes.agent import containers
from gpunodes.agent.runner import PULLING, STARTED
from tests.containers.conftest import insecure_registries, needs_podman, rootfs_tar
from tests.security.agent_helpers import wait_until

pytestmark = needs_podman

LAYER_BYTES = 24_000_000
RATE = 8_000_000  # bytes a second from the registry: the layer takes about 3 s


class SlowProxy:
    """127.0.0.1:PORT in front of `target`, passing requests on at once and answers at `rate` bytes
    a second."""

    def __init__(self, target: str, rate: int):
        host, port = target.rsplit(":", 1)
        self.target, self.rate = (host, int(port)), rate
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, 0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.rate), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, rate: int) -> None:
        try:
            while chunk := src.recv(32768):
                dst.sendall(chunk)
                if rate:
                    time.sleep(len(chunk) / rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.server.close()


@pytest.fixture
def slow_image(registry, podman, tmp_path, monkeypatch):
    """An image with a 24 MB layer in the registry, to be pulled through the slow proxy."""
    pushed = f"{registry}/team/big:1"
    tar = rootfs_tar(tmp_path / "big.tar", extra_bytes=LAYER_BYTES)
    podman._run("import", "--change", "ENV=PATH=/bin", str(tar), pushed, timeout=300)
    assert podman._run("push", "--tls-verify=false", pushed, timeout=300).returncode == 0
    podman._run("rmi", pushed)
    proxy = SlowProxy(registry, RATE)
    conf = insecure_registries(tmp_path / "registries.conf", registry, proxy.address)
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    via = f"{proxy.address}/team/big:1"
    yield via
    proxy.close()
    for name in (via, pushed):
        podman._run("rmi", "-f", name)


def test_a_pull_says_its_bytes_of_the_manifests_total_as_they_arrive(runner, reports, podman, slow_image):
    layers = containers.registry_layers(slow_image)
    total = sum(layers.values())
    assert LAYER_BYTES < total < LAYER_BYTES + 2_000_000, layers  # the layer, busybox and the config
    words = containers.size_words(total)
    assert runner.start(
        attempt_id=1, number=1, job_id=7, command=["echo inside"], use_shell=True, image=slow_image
    ) == ("started")
    done = wait_until(lambda: reports.finished(1), timeout=60, runner=runner, what="the pulled job")
    assert done["how"] == "exited" and done["exit_code"] == 0, reports.log_of(1)
    said = [k["text"] for k in reports.of(PULLING)]
    assert said[0] == f"pulling image {slow_image}, 0 of {words}", said
    got = [
        float(m[1])
        for line in said
        if (
            m := re.fullmatch(rf"pulling image {re.escape(slow_image)}, ([\d.]+) of {re.escape(words)}", line)
        )
    ]
    between = [g for g in got if 0 < g < float(words.split()[0])]
    assert len(between) >= 2, said  # at least two counts on the way, about one a second
    assert got == sorted(got), said  # never backwards
    assert said[-1].startswith(f"pulled image {slow_image}: "), said
    # The start report says how long the pull took (the forecast's typical pull of this image)...
    started = [k for k in reports.of(STARTED) if k["attempt_id"] == 1]
    assert started and started[0]["pull_s"] >= 2, started
    # ...the attempt's log keeps the first line, the last count and the end, not every count...
    log = reports.log_of(1)
    assert log.count(f"pulling image {slow_image}") == 2 and f"pulled image {slow_image}" in log, log
    # ...and the download files went with the pull.
    assert list((runner.state_path.parent / "pulls").iterdir()) == []
    # A second attempt of the image finds it here: no pull, and it says so (0 s).
    assert runner.start(
        attempt_id=2, number=1, job_id=8, command=["echo again"], use_shell=True, image=slow_image
    ) == ("started")
    wait_until(lambda: reports.finished(2), timeout=30, runner=runner, what="the second job")
    assert [k["pull_s"] for k in reports.of(STARTED) if k["attempt_id"] == 2] == [0.0]


def test_without_a_manifest_the_words_say_the_bytes_so_far():
    assert (
        containers.progress_words("r.example/x:1", 1_200_000_000, 0)
        == "pulling image r.example/x:1, 1.2 GB so far"
    )
    assert (
        containers.progress_words("r.example/x:1", 1_200_000_000, 3_400_000_000)
        == "pulling image r.example/x:1, 1.2 of 3.4 GB"
    )
    assert containers.progress_words("r.example/x:1", 300_000, 3_400_000_000) == (
        "pulling image r.example/x:1, 0.0 of 3.4 GB"
    )
    assert containers.registry_layers("127.0.0.1:1/nothing/here:1") is None  # nobody there: no total


def test_the_download_files_of_a_pull_a_killed_agent_left_go_at_the_next_start(runner):
    left = runner.state_path.parent / "pulls" / "pull-abc123"
    left.mkdir(parents=True)
    (left / "1").write_bytes(b"x" * 1000)
    runner.kill_orphans()
    assert not left.exists()
