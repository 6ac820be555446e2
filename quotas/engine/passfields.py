"""The fields of one GPU type's pass (rules.TypePass), declared once, and the methods that the rule classes
above TypePass call on it.

TypePass is one chain of classes, each a part of the pass in its own module (WaitingReasons ->
NodePlacement -> CoverAccounting -> VictimWalk -> FairReclaim -> BorrowingRules -> OwnCapacityRules ->
TypePass), all built on PassFields: a single line of bases, with every field's type said here, is what
lets the engine be compiled as it is (quotas/engine/native.py: mypyc makes each class a C struct). As
Python it changes nothing: the order in which methods are looked up is the one the mixins had."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quotas.engine.state import PassAttempt, PassOutput, PassStatus, ShareIndex, TypeState
    from quotas.engine.tree import TreeIndex
    from quotas.engine.views import QueuedView


class PassFields:
    """What a pass holds (see TypePass.__init__ and the parts' set-ups for what each one is)."""

    _bk_mine: int
    _exclude: bool
    _free_idx: dict[int, list[int]]
    _free_mine: bool
    _mf: int
    _node_history: dict[int, float]
    _pend_mine: bool
    _reasons: dict[tuple[Any, ...], str]
    _rec_nodes: set[int] | None
    _shortfalls_memo: dict[tuple[int, int], tuple[int, tuple[int, ...]]]
    _skipped: bool
    _taken: dict[int, list[Any]]
    _used: list[int]
    _vready: bool
    _whole: int
    base: TypeState
    ben_nodes: dict[Hashable, dict[int, int]]
    bens: list[tuple[tuple[Any, ...], int, int]]
    bk: list[list[int]]
    borrow_blocked: int
    borrow_cap: list[int]
    borrowed_total: int
    borrows_now: dict[int, tuple[int, int]]
    bptr: list[int]
    by_size: list[dict[int, list[tuple[Any, ...]]]]
    capacity: list[int]
    epoch: int
    fail_gang: tuple[int, int]
    fail_single: tuple[int, int]
    fair: bool
    fair_reclaim: bool
    free_total: int
    free_u: list[int]
    grace: list[int]
    held: list[int]
    held_for: list[tuple[Any, ...]]
    history: Mapping[tuple[str, str], float]
    hptr: list[int]
    in_fail: dict[int, tuple[int, int, int]]
    in_share: list[bool]
    iptr: list[int]
    is_ben: set[Hashable]
    largest_node: int
    largest_nodes: list[int]
    largest_schedulable: int
    lendable_idle: int
    lender: list[bool]
    lender_shares: list[int]
    marked: list[PassAttempt]
    may_borrow: list[bool]
    no_borrow: bool
    node_borrow_cap: list[int]
    node_capacity: list[int]
    node_lend_cap: list[int]
    node_names: list[str]
    node_net: list[int]
    node_offer: list[int]
    node_scale: list[Any]  # weight x capacity: an int or a float
    now: float
    out: PassOutput
    overcommitted: bool
    own_room_at_start: list[int]
    own_total: int
    pend: list[int]
    pend_nodes: set[int]
    pend_u: list[int]
    pgpus: list[dict[int, int]]
    pool: int
    protects: bool
    q: list[list[QueuedView]]
    qkey: list[list[tuple[Any, ...]]]
    rec: list[int]
    reserve: list[bool]
    reserve_idle: int
    sched: list[bool]
    schedulable_gpus: int
    sh: ShareIndex
    size: list[int]
    starvation_s: float
    status: list[PassStatus]
    sufmin: list[list[int]]
    t: str
    top_sum: int
    tree: TreeIndex | None
    vatts: list[list[PassAttempt]]
    version: int
    vlist: list[list[PassAttempt]]
    vnprio: list[list[int]]
    vptr: list[int]
    vshares: list[int]

    # Methods of the classes further down the chain, called by those above them.
    def _admit(
        self,
        s: int,
        k: int,
        placement: list[tuple[int, int]],
        borrowed: bool,
        victims: list[tuple[PassAttempt, str]],
    ) -> int:
        raise NotImplementedError

    def _earmark(
        self,
        s: int,
        k: int,
        placement: list[tuple[int, int]],
        victims: list[tuple[PassAttempt, str]],
        hold_free: bool = True,
    ) -> int:
        raise NotImplementedError

    def _blocked_on_placement(self, s: int, k: int, tol: int | tuple[int, ...]) -> int:
        raise NotImplementedError

    def _borrow_order(self, s: int) -> tuple[Any, ...] | float:
        raise NotImplementedError

    def _whole_free(self) -> int:
        raise NotImplementedError

    def _max_free(self) -> int:
        raise NotImplementedError
