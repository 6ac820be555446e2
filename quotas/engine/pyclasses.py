"""The engine's classes built on Python's own (dict, Mapping, RuntimeError), and a queued job's status
within one pass: a module of their own, never compiled (quotas/engine/native.py), because mypyc makes no
native class of those. Each is read from the module that used to hold it (state, simulate)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping

# A queued job's status within one pass.
TODO, ADMITTED, EARMARKED, BLOCKED, DEFERRED, RESERVED = range(6)


class PassStatus(dict):
    """One share's statuses in a pass, by queue index: only the jobs the pass looked at are stored."""

    __slots__ = ()

    def __missing__(self, k: int) -> int:
        return TODO


class LazyWaiting(Mapping):
    """Plan.waiting, computed lazily: most plans (the simulator's, the forecast's later passes) are
    never asked why a job waits, and writing a sentence for every queued job on every pass made the
    pass cost grow with the queue. A reason left for later is one whose inputs no longer change once
    the pass has moved past it (see TypePass.run), so reading it after the pass gives the same
    sentence as writing it at once."""

    __slots__ = ("_done", "_later", "__weakref__")

    def __init__(self, done: dict[Hashable, str], later: list) -> None:
        self._done = done
        self._later = later

    def _all(self) -> dict[Hashable, str]:
        if self._later:
            later, self._later = self._later, []
            for fn, s, ks in later:
                for k in ks:
                    fn(s, k)
        return self._done

    def __getitem__(self, key: Hashable) -> str:
        return self._all()[key]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, key: object) -> bool:
        return key in self._all()

    def __repr__(self) -> str:
        return repr(self._all())


class PolicyError(RuntimeError):
    """The planner returned a decision that cannot be applied (a policy bug)."""
