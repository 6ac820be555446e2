"""The scheduling policy: one pure function from a snapshot to a plan.

This module, with its parts views.py, state.py, tree.py and rules.py (and the modules rules.py is made of),
owns the semantics of ../shared/spec/SEMANTICS.md. It imports nothing from Django and does no I/O: production passes (quotas/scheduler.py), the simulator (quotas/engine/simulate.py), queue positions,
ETAs and the what-if preview all call `plan()` and the accounting helpers here. Never a second copy.

Identifiers (job ids, attempt ids) are opaque hashable, orderable values: ints in production, strings
in the simulator. Times are seconds (epoch in production, virtual in the simulator).

Where SEMANTICS leaves room, this module decides:
- Borrowed attempts (`borrowed_attempts`): per share and type the over-capacity part is filled by
  attempts admitted as borrowed first, then the most recently started (ties: later in queue order).
  An attempt with any GPU in that part is borrowed as a whole. Which attempts are borrowed does not
  depend on checkpoints; the order in which borrowed ones are taken does (rule 3: most recent safe
  point first).
- Victims follow rules 3, 4 and 9 exactly (`_reclaim_candidates`, `_in_share_candidates`,
  `_minimal_victims`): the order first, then the backward walk; no victim is chosen for being smaller
  or cheaper. What is left to this module: "borrowed" is per attempt (above), so a share's victims
  may leave it below its own capacity only by less than its largest victim (a 4-GPU attempt of a
  share borrowing 2 may go; nothing of that share after it): a candidate that would break this is
  skipped in the walk. Among the nodes of one tier (can start now / must wait) a beneficiary of an
  earlier pass goes back to the nodes its victims free before best fit, so that two beneficiaries
  do not swap nodes and pre-empt again. "Best fit" on a node where the job starts now counts the
  GPUs free now; on a node where it waits, those free or being freed.
- Over-commit: idle-lendable GPUs are clamped to what the hardware can hold (schedulable capacity -
  own use - RESERVE idle), so a guarantee that exceeds the hardware is never lent out twice.
- Gangs: whole nodes of the largest node size of the type: wholly free ones first, then those whose
  GPUs are all free or being freed; each group by node name.
- In-share pre-emption is skipped when the job can borrow right now (rule 4 says so; its victim
  would only borrow the same GPUs back).
- Beneficiaries of earlier pre-emptions go first, and may borrow ahead of everyone; among them, own
  capacity first (rule 2): each tries its own capacity in queue order, then those left try to
  borrow (one that borrowed what another needed for its own capacity was reclaimed by it in the next
  pass and borrowed it back in the one after, without end at one instant with zero grace); while a
  job waits for GPUs held for it, jobs behind it in its share do not borrow in that pass.
- Rule 10: a job "could run with protected candidates" when rule 9's walk, made again with the
  protected attempts in their places in the list, finds a set; the windows "that matter" are those of
  the protected attempts in that set (Plan.protected: the first of them ends at Plan.recheck_at, when
  the walk is made again; the last bounds the wait). No GPUs are held for it on any node, but for the
  rest of the pass it counts as a reclaim under way (its GPUs in its share's accounting, that set
  claimed), so that the jobs after it find victims of their own rather than wait for the same ones.
  "No new borrowing" holds from the moment the pass finds such a job: beneficiaries of earlier
  passes, which go first (rule 7), may still borrow. A protection window is the attempt's own
  share's, from the attempt's start.
- Rule 9's last paragraph counts GPUs per type: the free GPUs of the type left after the beneficiary
  (free now, not being freed, not held for another job) against the sum of RESERVE shares' idle
  capacity. A beneficiary that cannot start on free GPUs then waits on the nodes its victims free if
  one fits it, else without a node (its victims' GPUs free more than it needs on no node): it holds
  no free GPU either way.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Iterator, Mapping

# The package's layout: views.py (what the policy sees and decides, and the accounting read from a
# snapshot), tree.py (the organisation tree: its input, validation, nets, history and view), state.py (a
# GPU type's pass state, kept by Engine), rules.py (one pass: rules 1-11, with one module per concern:
# cover, placement, victims, reclaim, borrowing, fairshare, reasons). The names below are this module's
# public interface.
from quotas.engine.rules import NodeFit, TypePass, named_beneficiaries, run_pass  # noqa: F401
from quotas.engine.state import (  # noqa: F401
    MASKS,
    NODE_TABLES,
    LazyWaiting,
    PassAttempt,
    ShareIndex,
    TypeState,
    type_states,
)
from quotas.engine.tree import GroupSpec
from quotas.engine.views import (  # noqa: F401
    ADMITTED_BORROWED,
    ADMITTED_OWN,
    FAIR_SHARE,
    LEND,
    LEND_AND_BORROW,
    PRIORITY,
    RECLAIM,
    RESERVE,
    STRATEGIES,
    UNASSIGNED,
    UNLIMITED,
    Admission,
    NodeView,
    Placement,
    Plan,
    Preemption,
    ProtectionWait,
    QueuedView,
    RunningView,
    ShareUsage,
    ShareView,
    Snapshot,
    at_time,
    borrow_cap_gpus,
    borrowed_attempts,
    lending,
    never_fits,
    queue_key,
    usage,
    usage_from,
    usage_rows,
)

# The old private name, for callers outside the engine that still use it (tests/faults/audit.py).
_borrow_cap = borrow_cap_gpus


def plan(snapshot: Snapshot) -> Plan:
    """One scheduling pass (SEMANTICS "One scheduling pass", rules 1-10). Pure and deterministic.

    GPU types are independent (capacity, cover, limits and nodes are all per type), so the pass runs
    once per type, in type-name order. Within a type:
      A. beneficiaries of earlier pre-emptions, then starving queue heads, go first (rules 6, 7);
      B. own capacity, shares by lowest own-use ratio, each share's queue in order; a job that fits
         its remaining own capacity is admitted own, waits for GPUs being freed, or reclaims
         (rules 2, 3); one that does not may pre-empt lower-priority work of its share (rule 4);
         victims of both are a minimal set taken in order (rule 9);
      C. borrowing, shares by fewest borrowed GPUs relative to capacity (rule 5).
    Backfill (rule 6) is natural: a blocked job never stops the jobs behind it, except that a
    starving head job holds the node(s) it needs next.

    The same engine as `Engine.plan()`, built from the snapshot at once.
    """
    sh = ShareIndex(snapshot.shares, snapshot.running, snapshot.queued, snapshot.groups)
    bases = type_states(sh, snapshot.nodes, snapshot.running, snapshot.queued)
    return run_pass(bases, snapshot.now, snapshot.starvation_s, snapshot.history, snapshot.fair_reclaim)


class Engine:
    """The scheduling state of one cluster kept between passes, for callers that plan again and again
    as things change a little (the simulator, the forecast's replay, the what-if): they report each
    change (a job queued or gone from the queue, an attempt started, changed or gone, the nodes or
    shares replaced) and `plan(now)` costs about what the pass decides, not the size of the queue.

    `plan(now)` equals `plan(self.snapshot(now))` (tests/quotas/test_engine_incremental.py checks it
    after every event of random histories and of the generated traces). Rare changes (nodes, shares,
    an unknown share or type, a GPU claimed twice) rebuild the state from the views at the next pass.
    """

    def __init__(
        self,
        *,
        nodes: Iterable[NodeView] = (),
        shares: Iterable[ShareView] = (),
        running: Iterable[RunningView] = (),
        queued: Iterable[QueuedView] = (),
        starvation_s: float = 3600,
        groups: Iterable[GroupSpec] = (),
        fair_share_half_life_s: float = 0,
        fair_reclaim: bool = False,
        history: Mapping[tuple[str, str], float] | None = None,
    ) -> None:
        self.groups = tuple(groups)
        self.fair_share_half_life_s = fair_share_half_life_s
        self.fair_reclaim = fair_reclaim
        self.history: Mapping[tuple[str, str], float] = dict(history or {})
        self.nodes = tuple(nodes)
        self.shares = tuple(shares)
        self.running: dict[Hashable, RunningView] = {r.attempt_id: r for r in running}
        self.queued: dict[Hashable, QueuedView] = {j.job_id: j for j in queued}
        self.starvation_s = starvation_s
        self._sh: ShareIndex | None = None
        self._bases: dict[str, TypeState] = {}
        self._cluster: dict[str, int] | None = None  # schedulable GPUs per type
        # Checkpoints told with checkpoint_later, not applied yet: attempt id -> its latest. Applied when
        # a pass first reads a victim order, or when the views are read whole (snapshot, a rebuild).
        self._due: dict[Hashable, float] = {}
        # Whether a pass now would decide nothing (quiet()): so after a settled pass (Plan.settled)
        # that decided nothing, or once exactly the admissions of a settled plan have started and left
        # the queue (`_starting`, `_leaving`); it stays so while the only changes are checkpoints and
        # jobs queued that no pass could start or pre-empt for (TypeState.cannot_start); anything else
        # ends it. Flat layouts only: fair-share values move with time and the history. And only until
        # a share's head starts to starve (`_quiet_until`): a node held for it takes room, and a job of
        # its share that had own room may then pre-empt by rule 4 instead.
        self._quiet = False
        self._quiet_at = self._quiet_until = -math.inf
        self._heads_known = False  # whether `_quiet_until` has the heads' part (asked when first needed)
        self._starting: dict[Hashable, tuple[Admission, QueuedView]] = {}
        self._leaving: set[Hashable] = set()

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Engine:
        return cls(
            nodes=snapshot.nodes,
            shares=snapshot.shares,
            running=snapshot.running,
            queued=snapshot.queued,
            starvation_s=snapshot.starvation_s,
            groups=snapshot.groups,
            fair_share_half_life_s=snapshot.fair_share_half_life_s,
            fair_reclaim=snapshot.fair_reclaim,
            history=snapshot.history,
        )

    def snapshot(self, now: float, *, queued: bool = True) -> Snapshot:
        self._apply_checkpoints()
        return Snapshot(
            now=now,
            nodes=self.nodes,
            shares=self.shares,
            running=tuple(self.running.values()),
            queued=tuple(self.queued.values()) if queued else (),
            starvation_s=self.starvation_s,
            groups=self.groups,
            fair_share_half_life_s=self.fair_share_half_life_s,
            fair_reclaim=self.fair_reclaim,
            history=self.history,
        )

    def _state(self) -> tuple[ShareIndex, dict[str, TypeState]]:
        if self._sh is None:
            self._apply_checkpoints()
            self._sh = ShareIndex(self.shares, self.running.values(), self.queued.values(), self.groups)
            self._bases = type_states(self._sh, self.nodes, self.running.values(), self.queued.values())
            self._cluster = None
            for base in self._bases.values():
                base.before_victims = self._apply_checkpoints
        return self._sh, self._bases

    def plan(self, now: float) -> Plan:
        decided = run_pass(self._state()[1], now, self.starvation_s, self.history, self.fair_reclaim)
        self._unquiet()
        if not (self.groups or self.history or self.fair_share_half_life_s or self.fair_reclaim):
            self._quiet_at = now
            if decided.settled and decided.admissions:
                self._starting = {a.job_id: (a, self.queued[a.job_id]) for a in decided.admissions}
                self._leaving = set(self._starting)
            elif decided.settled:
                self._become_quiet()
        return decided

    def quiet(self, now: float) -> bool:
        """A pass at `now` would decide nothing: no admission, no pre-emption, no job waiting for
        protection (and so no recheck). Its waiting reasons are not known without it. Callers that
        pass after every change may count such a pass without making it (the simulator); the claim is
        checked against the pass made (tests/quotas/test_policy_settled.py,
        `simulate(check_skipped=True)`)."""
        if not (self._quiet and self._quiet_at <= now <= self._quiet_until):
            return False
        if not self._heads_known:  # (at the first question: most quiet spells end before one)
            self._heads_known = True
            self._quiet_until = min(self._quiet_until, self._starving_from())
        return now <= self._quiet_until

    def _become_quiet(self) -> None:
        self._quiet = True
        self._quiet_until = math.inf  # the jobs queued since may lower it; the heads' part when asked
        self._heads_known = False

    def _starving_from(self) -> float:
        """The first instant from the quiet pass on at which a share's head starts to starve."""
        until = math.inf
        after, wait = self._quiet_at, self.starvation_s
        named = named_beneficiaries(self._bases)  # (phase A skips them as it skips the flagged ones)
        for base in self._bases.values():
            bens = base.bens | named if named else base.bens
            for qs in base.q:
                if qs:  # the head rule 6 asks about, and the first that is no beneficiary (phase A's)
                    for job in (qs[0], next((j for j in qs if j.job_id not in bens), None)):
                        if job is not None and after <= job.submitted_at + wait < until:
                            until = job.submitted_at + wait
        return until

    def _unquiet(self) -> None:
        self._quiet = False
        if self._starting or self._leaving:
            self._starting, self._leaving = {}, set()

    def _settling(self, job_id: Hashable, *, started: RunningView | None = None) -> bool:
        """One of a settled plan's admitted jobs left the queue, or started (`started`, its attempt):
        True when that is what the plan said (the engine is quiet once all have)."""
        if started is None:
            if job_id not in self._leaving:
                return False
            self._leaving.discard(job_id)
        else:
            admitted = self._starting.get(job_id)
            if admitted is None:
                return False
            a, job = admitted
            if (started.share, started.gpu_type, started.priority, started.placement, started.borrowed) != (
                a.share,
                job.gpu_type,
                job.priority,
                a.placement,
                a.borrowed,
            ) or started.preempting:
                return False
            del self._starting[job_id]
        if not self._starting and not self._leaving:
            self._become_quiet()
        return True

    def usage(self) -> dict[str, dict[str, ShareUsage]]:
        """usage(self.snapshot(now)) from the kept state, without a walk over the attempts."""
        return usage_from(*self._usage_inputs())

    def usage_rows(self) -> Iterator[tuple[str, str, int, int, int, float]]:
        """usage()'s numbers as views.usage_rows() gives them, without building its objects."""
        return usage_rows(*self._usage_inputs())

    def _usage_inputs(self) -> tuple[Mapping[str, ShareView], dict[tuple[str, str], int], dict[str, int]]:
        sh, bases = self._state()
        used: dict[tuple[str, str], int] = {}
        for t, base in bases.items():
            for s, name in enumerate(sh.names):
                g = base.held[s] + base.grace[s]
                if g:
                    used[(name, t)] = g
        if self._cluster is None:
            self._cluster = {}
            for node in self.nodes:
                if node.schedulable:
                    self._cluster[node.gpu_type] = self._cluster.get(node.gpu_type, 0) + max(0, node.gpus)
        shares = dict(zip(sh.names, sh.views, strict=True))
        if len(shares) > len(sh.known):  # shares only named by work: those still named now (rare)
            named = {r.share for r in self.running.values()} | {q.share for q in self.queued.values()}
            shares = {n: v for n, v in shares.items() if n in sh.known or n in named}
        return shares, used, self._cluster

    # -- changes ---------------------------------------------------------------------------------------

    def _base(self, gpu_type: str, share: str) -> TypeState | None:
        """The type's state to update in place, or None when the next pass rebuilds anyway."""
        sh = self._sh
        if sh is None:
            return None
        base = self._bases.get(gpu_type)
        if base is None or share not in sh.sidx:
            self._sh = None  # a type or share the state does not know yet
            return None
        return base

    def set_nodes(self, nodes: Iterable[NodeView]) -> None:
        self.nodes = tuple(nodes)
        self._sh = None
        self._unquiet()

    def set_shares(self, shares: Iterable[ShareView]) -> None:
        self.shares = tuple(shares)
        self._sh = None
        self._unquiet()

    def set_starvation(self, starvation_s: float) -> None:
        self.starvation_s = starvation_s
        self._unquiet()

    def set_tree(
        self, groups: Iterable[GroupSpec], *, fair_share_half_life_s: float = 0, fair_reclaim: bool = False
    ) -> None:
        """The organisation tree and the fair-sharing settings changed (a layout change): rebuilt at the
        next pass, as for new shares."""
        self.groups = tuple(groups)
        self.fair_share_half_life_s = fair_share_half_life_s
        self.fair_reclaim = fair_reclaim
        self._sh = None
        self._unquiet()

    def set_history(self, history: Mapping[tuple[str, str], float]) -> None:
        """The decayed borrowing history (tree.FairShareHistory.values) to rank borrowers by."""
        self.history = dict(history)
        self._unquiet()

    def add_queued(self, job: QueuedView) -> None:
        """A job joins the queue, or a queued job's view changes (priority, beneficiary): it keeps its
        place in the order of the views."""
        old = self.queued.get(job.job_id)
        self.queued[job.job_id] = job
        if old is not None:
            base = self._base(old.gpu_type, old.share)
            if base is not None:
                base.remove_job(old)
        base = self._base(job.gpu_type, job.share)
        if base is not None:
            base.add_job(job)
        if self._starting or self._leaving:
            self._unquiet()  # (a settled plan's admissions not all applied yet)
        elif self._quiet:
            if old is None and base is not None and base.cannot_start(job):
                self._quiet_until = min(self._quiet_until, job.submitted_at + self.starvation_s)
            else:
                self._unquiet()

    def remove_queued(self, job_id: Hashable) -> QueuedView:
        job = self.queued.pop(job_id)
        base = self._base(job.gpu_type, job.share)
        if base is not None:
            base.remove_job(job)
        if not self._settling(job_id):
            self._unquiet()
        return job

    def remove_queued_many(self, job_ids: Iterable[Hashable]) -> None:
        """remove_queued for each (what a pass admitted), changing each GPU type's queues once."""
        jobs: dict[str, list[QueuedView]] = {}
        for job_id in job_ids:
            job = self.queued.pop(job_id)
            jobs.setdefault(job.gpu_type, []).append(job)
            if not self._settling(job_id):
                self._unquiet()
        for gpu_type, of_type in jobs.items():
            if self._sh is None:
                return  # the next pass rebuilds from the views
            base = self._bases.get(gpu_type)
            known = self._sh.sidx
            if base is None or any(job.share not in known for job in of_type):
                self._sh = None
                return
            base.remove_jobs(of_type)

    def add_running(self, run: RunningView) -> None:
        """A new attempt, or a new view of one (pre-empting now): it keeps its place in the order."""
        old = self.running.get(run.attempt_id)
        self.running[run.attempt_id] = run
        if old is not None:
            base = self._base(old.gpu_type, old.share)
            if base is not None:
                base.remove_run(old)
        base = self._base(run.gpu_type, run.share)
        if base is not None:
            base.add_run(run)
            if not base.regular:
                self._sh = None
        if not (old is None and self._starting and self._settling(run.job_id, started=run)):
            self._unquiet()

    def checkpoint(self, attempt_id: Hashable, at: float) -> RunningView:
        """A running attempt reported a checkpoint at `at`: its safe point moves (SEMANTICS "Checkpoints
        and safe points"), and with it its place in the victim orders of rules 3 and 4. Returns the new
        view. A report older than the one it has changes nothing."""
        run = self.running[attempt_id]
        if run.last_checkpoint_at is not None and at <= run.last_checkpoint_at:
            return run
        # (The constructor, positionally: dataclasses.replace took half of a checkpoint's cost, and the
        # simulator reports one every checkpoint_every_s of every attempt that has it.)
        run = RunningView(
            run.attempt_id,
            run.job_id,
            run.share,
            run.gpu_type,
            run.priority,
            run.submitted_at,
            run.started_at,
            run.placement,
            run.borrowed,
            run.preempting,
            run.beneficiary_job_id,
            at,
            run.fair_reclaims,
        )
        self.running[attempt_id] = run
        base = self._base(run.gpu_type, run.share)
        if base is not None:
            base.checkpoint(run)
        return run

    def checkpoint_later(self, attempt_id: Hashable, at: float) -> None:
        """checkpoint(), applied only when something reads what it changes: a pass's victim order (rules
        3, 4 and 11, which most passes never read), a snapshot, current(). The same decisions as
        checkpoint() at once; the simulator tells one at every checkpoint_every_s of every attempt."""
        if at > self._due.get(attempt_id, -math.inf):
            self._due[attempt_id] = at

    def current(self, attempt_id: Hashable) -> RunningView:
        """A running attempt's view, with a checkpoint told for later applied."""
        at = self._due.pop(attempt_id, None)
        return self.running[attempt_id] if at is None else self.checkpoint(attempt_id, at)

    def release(self) -> None:
        """For an engine no longer used (the simulator's, at the end of its run): its type states let go
        of the engine (each held it to apply the checkpoints told for later), so that reference counting
        frees both, not the cyclic collector."""
        for base in self._bases.values():
            base.before_victims = None

    def _apply_checkpoints(self) -> None:
        if self._due:
            due, self._due = self._due, {}
            for attempt_id, at in due.items():
                self.checkpoint(attempt_id, at)

    def remove_running(self, attempt_id: Hashable) -> RunningView:
        self._due.pop(attempt_id, None)
        self._unquiet()
        run = self.running.pop(attempt_id)
        base = self._base(run.gpu_type, run.share)
        if base is not None:
            base.remove_run(run)
            if not base.regular:
                self._sh = None
        return run
