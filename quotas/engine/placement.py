"""Where a job goes (rule 9's last sentence, rule 6's held nodes): the free-count buckets of one GPU type's
nodes as a pass changes them, best fit, gangs of whole nodes, and NodeFit, rule 9's node test kept as
victims are taken and given back. A part of rules.TypePass."""

from __future__ import annotations

import heapq
from collections.abc import Collection

from quotas.engine.reasons import WaitingReasons
from quotas.engine.state import (
    PassAttempt,
)


class NodeFit:
    """Rule 9's node test for one job of g GPUs, kept as victims are taken and given back: does some
    fitting node (or do the needed whole nodes) have the job's GPUs free or being freed?

    Nodes that fit without any victim are counted once (`base`); a node touched by victims is looked
    at again only when its victims change (`extra`: GPUs this job's victims free there)."""

    __slots__ = ("tp", "g", "gang", "k", "base", "hits", "extra")

    def __init__(self, tp: NodePlacement, g: int, fits: bool | None = None) -> None:
        """`tp`: the pass of one GPU type (rules.TypePass, whose node part NodePlacement is: named so
        that this module needs no import of rules, which imports it). `fits`: whether a single-node job
        fits a node without victims, when the caller knows."""
        self.tp = tp
        self.g = g
        self.gang = g > tp.largest_node
        self.extra: dict[int, int] = {}
        self.hits = 0  # touched nodes that fit only thanks to the victims
        if self.gang:
            self.k = g // tp.largest_node
            # Nodes of size M with all GPUs free or being freed: the wholly free ones (counted per pass)
            # and those with GPUs being freed (few) that are otherwise free.
            fu, pu, M, size = tp.free_u, tp.pend_u, tp.largest_node, tp.size
            self.base = tp._whole_free() + sum(
                1 for i in tp.pend_nodes if pu[i] and size[i] == M and fu[i] + pu[i] == M
            )
        else:
            self.k = 1
            if fits is None:
                fits = tp._place(g, None, True) is not None
            self.base = 1 if fits else 0

    def _fits(self, i: int) -> bool:
        e = self.extra.get(i, 0)
        if not e:
            return False  # counted in `base` if it fits without victims
        tp = self.tp
        avail = tp.free_u[i] + tp.pend_u[i] + e
        if self.gang:
            return tp.size[i] == tp.largest_node and avail == tp.largest_node
        return avail >= self.g and tp.free_u[i] + tp.pend_u[i] < self.g

    def add(self, a: PassAttempt, sign: int) -> None:
        sched = self.tp.sched
        for i, c in a.on:
            if not sched[i]:
                continue
            before = self._fits(i)
            e = self.extra.get(i, 0) + sign * c
            if e:
                self.extra[i] = e
            else:
                del self.extra[i]
            self.hits += self._fits(i) - before

    def ok(self) -> bool:
        if self.gang:
            return self.base + self.hits >= self.k
        return bool(self.base or self.hits)


class NodePlacement(WaitingReasons):
    """The pass's nodes: free GPUs per node in buckets by free count, best fit, gangs, held GPUs."""

    def _set_free(self, i: int, v: int) -> None:
        if not self._free_mine:
            self.free_u = self.free_u.copy()
            self._free_mine = True
        if self.largest_node:
            M = self.largest_node
            self._whole += (v == M) - (self.free_u[i] == M)
        self.free_total += v - self.free_u[i]
        self.free_u[i] = v
        if v:
            heapq.heappush(self._bucket(v), i)
        self._mf = -1
        self.version += 1

    def _bucket(self, v: int) -> list[int]:
        """Heap v of the free-count buckets, to change: this pass's own copy, made on first change
        (most passes change none, and the base's heaps outlive the pass)."""
        h = self.bk[v]
        if not self._bk_mine >> v & 1:
            h = self.bk[v] = h.copy()
            self._bk_mine |= 1 << v
        return h

    def _valid(self, v: int) -> list[int]:
        """Heap v once its head is stale: with a head that has v GPUs free now, or empty. Entries that
        went stale before the pass are dropped from the base's heap for every later pass (the base
        replaces it); those this pass made stale, from its own copy."""
        fu = self.free_u
        h = self.bk[v]
        if not self._bk_mine >> v & 1:
            h = self.bk[v] = self.base.fresh_bucket(v)
            if not h or fu[h[0]] == v:
                return h
        h = self._bucket(v)
        while h and fu[h[0]] != v:
            heapq.heappop(h)
        return h

    def _best_free(self, g: int) -> int | None:
        """Best fit on free GPUs: the node left with the fewest free GPUs, ties by name."""
        fu = self.free_u
        bk = self.bk
        for v in range(g, self.largest_schedulable + 1):
            h = bk[v]
            if h and fu[h[0]] != v:
                h = self._valid(v)
            if h:
                return h[0]
        return None

    def _free_list(self, i: int) -> list[int]:
        """Node i's free GPU indexes, ascending (what is left of them as admissions take them)."""
        idx = self._free_idx.get(i)
        if idx is None:
            m = self._used[i]
            idx = [x for x in range(self.size[i]) if not m >> x & 1] if self.sched[i] else []
            self._free_idx[i] = idx
        return idx

    def _whole_free(self) -> int:
        """How many nodes have all their GPUs free (only nodes of the largest size M can): kept by the
        base between passes and by _set_free within one (a blocked gang's reason asks, at 256 nodes)."""
        return self._whole

    def _max_free(self) -> int:
        if self._mf < 0:
            fu = self.free_u
            self._mf = 0
            for v in range(self.largest_schedulable, 0, -1):
                h = self.bk[v]
                if h and fu[h[0]] != v:
                    h = self._valid(v)
                if h:
                    self._mf = v
                    break
        return self._mf

    def _extra(self, *victim_lists: list[tuple[PassAttempt, str]]) -> dict[int, int]:
        """GPUs that the given victims will free, per schedulable node."""
        extra: dict[int, int] = {}
        for lst in victim_lists:
            for a, _ in lst:
                for i, c in a.on:
                    if self.sched[i]:
                        extra[i] = extra.get(i, 0) + c
        return extra

    def _place(
        self,
        g: int,
        extra: dict[int, int] | None = None,
        use_pend: bool = False,
        prefer: Collection[int] | None = None,
        wait: bool = False,
    ) -> list[tuple[int, int]] | None:
        """Where g GPUs would go (rule 9's last sentence): on free GPUs, and if asked on GPUs being
        freed (`pend_u`, and `extra` from victims chosen for this job). A node where the job can start
        now (its GPUs free, not being freed) comes first, unless the job is to `wait` for GPUs being
        freed; then, for a beneficiary of an earlier pass, the nodes its victims free (`prefer`); then
        best fit (fewest GPUs left free on the node); ties: node name. Single node, or whole nodes for a
        gang."""
        if g > self.largest_node:
            return self._place_gang(g // self.largest_node, extra, use_pend, wait)
        fu = self.free_u
        best = None
        i = None if wait else self._best_free(g)
        if i is not None:
            # Every node with g free GPUs is in the first tier; among them, best fit on free GPUs.
            if prefer:
                for j in prefer:
                    if fu[j] >= g and self.sched[j]:
                        key = (0, 0, fu[j] - g, j)
                        if best is None or key < best:
                            best = key
            if best is None:
                best = (0, 0 if prefer is not None and i in prefer else 1, fu[i] - g, i)
        if (use_pend or extra) and best is None:
            cand = set(self.pend_nodes) if use_pend else set()
            if extra:
                cand.update(extra)
            for i in cand:
                nf = (self.pend_u[i] if use_pend else 0) + (extra.get(i, 0) if extra else 0)
                avail = fu[i] + nf
                if not nf or avail < g or not self.sched[i]:
                    continue
                key = (1, 0 if prefer is not None and i in prefer else 1, avail - g, i)
                if best is None or key < best:
                    best = key
        return None if best is None else [(best[3], g)]

    def _place_gang(
        self, k: int, extra: dict[int, int] | None, use_pend: bool, wait: bool = False
    ) -> list[tuple[int, int]] | None:
        """k whole nodes of the type's largest size: wholly free ones first (none if the gang is to
        `wait` for GPUs being freed), then those whose GPUs are all free or being freed; each group by
        node name."""
        M = self.largest_node
        fu = self.free_u
        chosen: list[int] = []
        if self.largest_schedulable >= M and not wait:
            h = self._bucket(M)
            popped: list[int] = []
            while h and len(chosen) < k:
                i = heapq.heappop(h)
                if fu[i] != M or i in popped:
                    continue
                popped.append(i)
                chosen.append(i)
            for i in popped:
                heapq.heappush(h, i)  # only a proposal: the commit changes free_u
        if len(chosen) < k and (use_pend or extra):
            cand = set(self.pend_nodes) if use_pend else set()
            if extra:
                cand.update(extra)
            waiting = []
            for i in cand:
                if self.size[i] != M or not self.sched[i]:
                    continue
                nf = (self.pend_u[i] if use_pend else 0) + (extra.get(i, 0) if extra else 0)
                if nf and fu[i] + nf == M:
                    waiting.append(i)
            waiting.sort()
            chosen.extend(waiting[: k - len(chosen)])
        if len(chosen) < k:
            return None
        return [(i, M) for i in sorted(chosen)]

    def _most_available(self, k: int) -> list[int]:
        """The k nodes of the largest size with the most GPUs free or being freed (ties: name), read
        level by level from the free-count buckets and the few nodes with GPUs being freed, instead of
        ranking every node; when fewer than k have any, the first of the others by name."""
        M, fu, pu, size, bk = self.largest_node, self.free_u, self.pend_u, self.size, self.bk
        pend = [i for i in self.pend_nodes if size[i] == M]
        chosen: list[int] = []
        for v in range(min(M, len(bk) - 1), 0, -1):
            level = {i for i in bk[v] if fu[i] == v and size[i] == M and not pu[i]}
            level.update(i for i in pend if fu[i] + pu[i] == v)
            if level:
                chosen.extend(sorted(level)[: k - len(chosen)])
                if len(chosen) == k:
                    return chosen
        taken = set(chosen)  # every other node has nothing free or being freed
        for i in self.largest_nodes:
            if len(chosen) == k:
                break
            if i not in taken:
                chosen.append(i)
        return chosen

    def _own_pend(self) -> None:
        """pend_u and pend_nodes, this pass's own copies from here on (see __init__)."""
        if not self._pend_mine:
            self.pend_u = self.pend_u.copy()
            self.pend_nodes = set(self.pend_nodes)
            self._pend_mine = True

    def _hold(
        self, placement: list[tuple[int, int]], free_too: bool = True
    ) -> tuple[tuple[tuple[str, int], ...], int]:
        """Reserve GPUs on these nodes for one waiting job: GPUs being freed first, then free ones (not
        `free_too`: none). Returns what was held and how many of those GPUs were being freed."""
        held = []
        from_pend = 0
        for i, c in placement:
            take = min(c, self.pend_u[i])
            if take:  # (the copies only when this pass first changes them: most holds take none)
                self._own_pend()
                from_pend += take
                self.pend_u[i] -= take
                if not self.pend_u[i]:
                    self.pend_nodes.discard(i)
            if not free_too:
                c = take
            elif c > take:
                self._set_free(i, self.free_u[i] - (c - take))
            if c:
                held.append((self.node_names[i], c))
        return tuple(held), from_pend
