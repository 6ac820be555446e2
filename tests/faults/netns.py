"""A network namespace per agent, so that a partition in a fault test is a real one: the agent runs in
a namespace of its own, joined to the host by a veth pair with a /30 of 10.213.0.0/16 (an address range
that exists only while the test runs), and reaches the broker at the host side's address. Two namespaces
can also be joined to each other directly (`Link`: the nodes of a multi-node job). Taking the
namespace's end of the link down cuts the agent off from everything (the broker, the control side)
while its jobs, the control side and the other agents run on.

Processes enter only the network namespace (`nsenter --net`), not `ip netns exec`, which also remounts
/sys in a mount namespace of its own and so hides the cgroup tree the agent puts its attempts in.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN): `available()` says why not. `Netns` always removes
what it made (`close`, also from a context manager); a free /30 is picked each time, so a namespace that
a killed run left behind (`ip netns list`, names `gqt*`) is in no one's way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PREFIX = "gqt"  # the names of these tests' namespaces and veths
NETNS_DIR = Path("/run/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def available() -> tuple[bool, str]:
    """Whether this process may make network namespaces; else the reason to skip."""
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return False, "network-namespace tests need `ip` (iproute2) and `nsenter` (util-linux)"
    if os.geteuid() != 0:
        return False, "network-namespace tests need root (`ip netns add` is not permitted to this user)"
    probe = f"{PREFIX}probe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return False, f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    try:  # a veth pair into it, and entering it, may still be refused (a container without the caps)
        veth = _ip(
            "link",
            "add",
            f"{probe}h",
            "type",
            "veth",
            "peer",
            "name",
            f"{probe}n",
            "netns",
            probe,
            check=False,
        )
        if veth.returncode != 0:
            return False, f"a veth pair cannot be made here: {veth.stderr.strip()}"
        enter = subprocess.run(
            ["nsenter", f"--net={NETNS_DIR / probe}", "--", "true"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if enter.returncode != 0:
            return False, f"`nsenter --net` is not permitted here: {enter.stderr.strip()}"
    finally:
        _ip("link", "del", f"{probe}h", check=False)
        _ip("netns", "del", probe, check=False)
    return True, ""


def _free_subnet() -> int:
    """A third octet X whose 10.213.X.0/30 no interface of the host uses."""
    used = _ip("-4", "-o", "addr", "show").stdout
    for x in [*range(os.getpid() % 200 + 20, 254), *range(20, 254)]:
        if f"10.213.{x}." not in used:
            return x
    raise RuntimeError("no free 10.213.X.0/30 for a test network")


class Netns:
    """One namespace with its veth pair: `host_addr` on the host side, `addr` inside."""

    def __init__(self, label: str):
        x = _free_subnet()
        self.name = f"{PREFIX}{label}{x}"[:15]
        self.host_veth = f"{PREFIX}h{x}"
        self.ns_veth = f"{PREFIX}n{x}"
        self.host_addr = f"10.213.{x}.1"
        self.addr = f"10.213.{x}.2"
        self._made = False
        try:
            _ip("netns", "add", self.name)
            self._made = True
            _ip("link", "add", self.host_veth, "type", "veth", "peer", "name", self.ns_veth)
            _ip("link", "set", self.ns_veth, "netns", self.name)
            _ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_veth)
            _ip("link", "set", self.host_veth, "up")
            _ip("-n", self.name, "addr", "add", f"{self.addr}/30", "dev", self.ns_veth)
            _ip("-n", self.name, "link", "set", self.ns_veth, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace's network (and nothing else of it)."""
        return ["nsenter", f"--net={NETNS_DIR / self.name}", "--", *argv]

    def cut(self) -> None:
        """The agent's link goes down: nothing in or out of the namespace."""
        _ip("-n", self.name, "link", "set", self.ns_veth, "down")

    def heal(self) -> None:
        _ip("-n", self.name, "link", "set", self.ns_veth, "up")

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]

    def close(self) -> None:
        """Kill what still runs inside, remove the namespace and the veth pair (idempotent)."""
        if self._made:
            for pid in self.pids():
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", self.name, check=False)
            self._made = False
        _ip("link", "del", self.host_veth, check=False)  # gone with the namespace's end, normally

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Link:
    """A veth pair between two of a test's namespaces with a /30 of its own (`a_addr` in `a`, `b_addr` in
    `b`): two "hosts" that reach each other directly, as the nodes of a multi-node job do, while each
    reaches the broker through its own link to the host. Gone with either namespace, or `close`."""

    def __init__(self, a: Netns, b: Netns):
        x = _free_subnet()
        self.a, self.b = a, b
        self.a_veth, self.b_veth = f"{PREFIX}l{x}a", f"{PREFIX}l{x}b"
        self.a_addr, self.b_addr = f"10.213.{x}.1", f"10.213.{x}.2"
        try:
            _ip("link", "add", self.a_veth, "type", "veth", "peer", "name", self.b_veth)
            _ip("link", "set", self.a_veth, "netns", a.name)
            _ip("link", "set", self.b_veth, "netns", b.name)
            _ip("-n", a.name, "addr", "add", f"{self.a_addr}/30", "dev", self.a_veth)
            _ip("-n", b.name, "addr", "add", f"{self.b_addr}/30", "dev", self.b_veth)
            _ip("-n", a.name, "link", "set", self.a_veth, "up")
            _ip("-n", b.name, "link", "set", self.b_veth, "up")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Remove the pair (idempotent: it may be gone with its namespaces, or not made at all)."""
        _ip("link", "del", self.a_veth, check=False)
        if self.a._made:
            _ip("-n", self.a.name, "link", "del", self.a_veth, check=False)
