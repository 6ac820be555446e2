"""A private redis-server with the README's settings ("Production setup", Redis) and its per-node ACL
users (config.redisbroker.node_acl, the line the README shows), for the broker's security tests."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import redis

from tests.faults.conftest import free_port
from tests.live.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]


def documented_redis_conf() -> list[tuple[str, ...]]:
    """The redis.conf settings the README gives, as (name, value, ...) tuples."""
    readme = (ROOT / "README.md").read_text()
    sentence = re.search(r"in `redis.conf`:(.*?)\(size", readme, re.S).group(1)
    return [tuple(shlex.split(item)) for item in re.findall(r"`([^`]+)`", sentence)]


class ConfiguredRedis:
    """redis-server on a free port, without persistence, with `conf` (the README's unless told)."""

    def __init__(self, tmp: Path, conf: list[tuple[str, ...]] | None = None, **override: str):
        self.port = free_port()
        self.tmp = tmp
        conf = documented_redis_conf() if conf is None else conf
        self.conf = [(name, *override.pop(name.replace("-", "_"), " ".join(v)).split()) for name, *v in conf]
        self.conf += [(name.replace("_", "-"), *value.split()) for name, value in override.items()]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def user_url(self, node: str) -> str:
        return f"redis://node-{node}:{node}-pw@127.0.0.1:{self.port}/0"

    def start(self) -> ConfiguredRedis:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no"]
        for name, *values in self.conf:
            argv += [f"--{name}", *values]
        out = open(self.tmp / f"redis-{self.port}.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.tmp)
        wait_for(self._ping, 10, what="redis-server to answer")
        return self

    def _ping(self) -> bool:
        assert self.proc.poll() is None, (self.tmp / f"redis-{self.port}.log").read_text()
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def admin(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=30)

    def add_node(self, node: str) -> redis.Redis:
        """The node's ACL user as the README's line makes it; a client logged in as it."""
        from config.redisbroker import node_acl

        rules = shlex.split(" ".join(node_acl(node, f"{node}-pw")))  # as redis-cli splits the line
        self.admin().execute_command("ACL", "SETUSER", f"node-{node}", *rules)
        return redis.Redis.from_url(self.user_url(node), socket_timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
