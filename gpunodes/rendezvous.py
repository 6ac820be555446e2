"""How the ranks of an attempt find each other (README, "Real GPU hosts"): rank 0's host and a port chosen
once per attempt, at admission, by the control side, so that every rank gets the same (torch.distributed's
MASTER_ADDR and MASTER_PORT; the agent turns a start's `rendezvous` into the job's variables,
gpunodes.agent.runner.rendezvous_env). A fresh port for each attempt: a resumed gang never meets the
previous attempt's half-closed sockets."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence

from gpunodes.addresses import valid_address

_random = random.SystemRandom()


def port_range(value: str | None = None) -> tuple[int, int]:
    """RENDEZVOUS_PORTS ("FIRST-LAST") as (first, last); ValueError saying what is wrong."""
    if value is None:
        from django.conf import settings

        value = settings.RENDEZVOUS_PORTS
    first, sep, last = str(value).partition("-")
    try:
        low, high = int(first), int(last)
    except ValueError:
        raise ValueError(f"RENDEZVOUS_PORTS must be FIRST-LAST, two port numbers, not {value!r}") from None
    if not sep or not 1024 <= low <= high <= 65535:
        raise ValueError(
            f"RENDEZVOUS_PORTS must be FIRST-LAST with 1024 <= FIRST <= LAST <= 65535, not {value!r}"
        )
    return low, high


def choose_port(in_use: Iterable[int], avoid: int | None = None, ports: tuple[int, int] | None = None) -> int:
    """A port of RENDEZVOUS_PORTS that no live attempt with the same rank-0 host holds (`in_use`), other
    than `avoid` (the job's previous attempt's). With every port taken, one of them anyway (the range is
    too small for the host: README says how to size it), never `avoid` where there is another."""
    low, high = ports or port_range()
    taken = set(in_use) | ({avoid} if avoid is not None else set())
    size = high - low + 1
    start = _random.randrange(size)
    for step in range(size):
        port = low + (start + step) % size
        if port not in taken:
            return port
    others = [p for p in range(low, high + 1) if p != avoid]
    return _random.choice(others) if others else low


def node_address(address: str, hostname: str) -> str | None:
    """Where a node's peers reach it: the address its agent advertises, else its host name, if valid."""
    for candidate in (address, hostname):
        if valid_address(candidate):
            return candidate
    return None


def rendezvous(
    nodes: Sequence[str], gpus: Sequence[int], port: int | None, addresses: Mapping[str, str | None]
) -> dict | None:
    """A start message's `rendezvous` for an attempt on `nodes` (rank order) with `gpus` GPUs on each:
    None where the attempt has no port (admitted before ports were chosen) or a rank has no address."""
    hosts = [addresses.get(node) for node in nodes]
    if port is None or not all(hosts):
        return None
    return {"master_addr": hosts[0], "master_port": port, "hosts": hosts, "world_size": sum(gpus)}
