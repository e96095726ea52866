"""Scheduler: groups compute nodes into kernels (`KernelGroup`, kernel_group.py) and
explains every decision.

Fusion is greedy in graph order. Each rule is one function returning `None`
(allowed) or a `Refusal` with the reason in a user's words and the option that
would change it. The moment a consumer is tried against a producer's kernel, the
scheduler records a `Decision` per data edge between them in `Schedule.decisions`,
keyed by node names; explain.py maps those to `FusionDecision` events, so "why
not fused" is never reconstructed after the fact.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence

from fuselens.compiler import ir
from fuselens.compiler.ir import ComputeNode, Expr, GraphIR
from fuselens.compiler.kernel_group import (KernelGroup, fmt_sizes, join_reason, kernel_name, label, lines_up,
                                            loop_space, mb, same_space, space_key)
from fuselens.compiler.step_memory import memory_edges, op_by_op_liveness, step_bytes


@dataclass
class Refusal:
    rule: str
    reason: str
    option: str = ""


@dataclass(frozen=True)
class Decision:
    """One data edge the scheduler tried to fuse, recorded when it tried.

    `producer` and `consumer` are IR step names: unique and stable for the
    whole graph, unlike kernel objects, which are merged and freed during
    scheduling (keying by their `id()` once attributed a refusal to whatever
    kernel later reused the address). The last decision for an edge is the
    one that stands."""

    verdict: Literal["fused", "not_fused"]
    producer: str
    consumer: str
    rule: str  # "fused", or the refusing rule's name ("same-index", "max-fusion-size", ...)
    reason: str
    option: str = ""  # the compiler option that would change a refusal


@dataclass
class Schedule:
    """The scheduler's result: units (KernelGroup | ExternNode) in execution order."""

    units: list[Any]
    groups: list[KernelGroup]
    decisions: list[Decision]  # in the order they were made
    group_of: dict[str, KernelGroup]

    def last_decisions(self) -> dict[tuple[str, str], Decision]:
        """The standing decision per (producer, consumer) edge: the last one made."""
        return {(d.producer, d.consumer): d for d in self.decisions}


class Scheduler:
    def __init__(self, graph: GraphIR, options: Any, output_sources: set[str], kernel_prefix: str = "cpp_fused") -> None:
        self.g = graph
        self.kernel_prefix = kernel_prefix
        self.opt = options
        self.steps = graph.steps
        self.index = {s.name: i for i, s in enumerate(self.steps)}
        # buffers -> the step producing them; producers and readers (step indices) of each step
        self.producer, self.deps, self.users = ir.step_edges(self.steps)
        self.output_sources = output_sources
        # What is traced of each node's body lives in graph.node_analysis (ir.analysis_of): its
        # loads, and per loop space of a candidate kernel its loads and its own offset in that
        # loop. Each candidate fusion checks every member again, with the same few spaces
        # (EfficientNet-B0's training graphs: 3.4 of 5.4 s of scheduling, recomputing these); a
        # graph scheduled again after recompute_narrow_stores keeps them for every node whose
        # body that left alone.

        # member names (in graph order) of a set found to read each other at their own
        # index -> the loop space it was checked in (rule_same_index)
        self._clean: dict[tuple[str, ...], tuple] = {}
        self._clean_of: dict[str, list[tuple[str, ...]]] = {}  # member name -> the sets above it is in
        # transitive ancestors and descendants of each step as bitmasks, and every step in a
        # kernel so far: rule_no_cycle looks through the other kernels only when one holds a
        # step that needs a member (DenseNet-121's training graphs: 15,000 checks, 2.2 of 5.5 s
        # of scheduling)
        self.anc, self.desc = transitive_edges(self.deps, self.users)
        self._grouped = 0
        self.readers_of = ir.buffer_readers(self.steps)  # buffer -> steps reading it
        self.out_steps = {self.producer[n] for n in output_sources if n in self.producer}
        self.nbytes = [step_bytes(graph, s) for s in self.steps]
        self.mem = memory_edges(graph, self.steps, self.deps, self.users, self.readers_of)
        self._live_before, self.graph_peak = op_by_op_liveness(
            self.nbytes, self.mem.users, self.out_steps,
            [(graph.nbytes(b), readers[-1]) for b, readers in self.mem.released_readers.items()])
        self._bytes_upto = list(itertools.accumulate(self.nbytes, initial=0))  # bytes made by steps before i
        self.group_of: dict[str, KernelGroup] = {}
        self.decisions: list[Decision] = []
        self._unit_masks: dict[int, tuple[int, int]] = {}  # live kernel -> (members, members and their ancestors)

    # -- rules: each returns None (fuse) or a Refusal -------------------------
    def rule_enabled(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        if not self.opt.fusion:
            return Refusal("fusion-off", "fusion is turned off", "fusion")
        return None

    def rule_size(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        # the nodes the kernel places, as Inductor counts: the ops a node recomputes inline
        # (inline_pointwise) are part of that node
        n = len(g.nodes) + len(new)
        if n > self.opt.max_fusion_size:
            return Refusal("max-fusion-size", f"the kernel would hold {n} nodes, more than max_fusion_size="
                           f"{self.opt.max_fusion_size}", "max_fusion_size")
        return None

    def rule_iteration_space(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        full, rflags = list(g.full), g.rflags
        for n in new:
            nfull, nflags = loop_space(n)
            if n.is_reduction:
                if rflags is None:
                    # the kernel's pointwise members run in the reduction's loop: it must be
                    # theirs, or theirs with dims merged or split (`new`'s own are checked in turn)
                    if not all(lines_up(nfull, m.size) for m in g.nodes):
                        return Refusal("iteration-space", f"different iteration space: {fmt_sizes(full)} vs "
                                       f"{fmt_sizes(nfull)} reduced to {fmt_sizes(n.outer_size())}")
                    full = nfull
                    if not self.opt.reduction_fusion:
                        return Refusal("reduction-fusion", "pointwise work before a reduction is not fused into it "
                                       "(reduction_fusion is off)", "reduction_fusion")
                    rflags = nflags
                elif not (ir.same_sizes(nfull, full) and nflags == rflags):
                    return Refusal("iteration-space", f"different iteration space: rows of {fmt_sizes(full)} vs "
                                   f"{fmt_sizes(nfull)} reduced over other dims")
                elif not self.opt.reduction_fusion:
                    return Refusal("reduction-fusion", "several reductions over the same rows are not fused "
                                   "(reduction_fusion is off)", "reduction_fusion")
            else:
                outer = full if rflags is None else [s for s, r in zip(full, rflags) if not r]
                if lines_up(full, n.size):
                    continue
                if rflags is not None and lines_up(outer, n.size):
                    continue
                what = (f"{fmt_sizes(full)}" if rflags is None
                        else f"{fmt_sizes(full)} and {fmt_sizes(outer)} after reduction")
                return Refusal("iteration-space", f"different iteration space: {fmt_sizes(nfull)} vs {what}")
        return None

    def _merged(self, g: KernelGroup, new: Sequence[ComputeNode]) -> KernelGroup:
        full, rflags = list(g.full), g.rflags
        for n in new:
            if n.is_reduction and rflags is None:
                full, rflags = loop_space(n)  # the pointwise members join the reduction's loop
        return KernelGroup(sorted(g.nodes + list(new), key=lambda x: self.index[x.name]), full, rflags)

    def rule_epilogue(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        if self.opt.epilogue_fusion:
            return None
        m = self._merged(g, new)
        reds = {n.name for n in m.nodes if n.is_reduction}
        for n in new:
            if not n.is_reduction and n.reads & reds:
                return Refusal("epilogue-fusion", "pointwise work after a reduction is not fused into it "
                               "(epilogue_fusion is off)", "epilogue_fusion")
        return None

    def rule_same_index(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        """Inside a kernel a value is only available at the element being computed:
        a consumer must read each fused producer at the producer's own index."""
        m = self._merged(g, new)
        members = {n.name: n for n in m.nodes}
        ranges = m.ranges()
        space = space_key(m)
        # the pairs among g's own members passed in this loop space already when g was
        # checked as it grew: only those with a new member can fail (a kernel of 60 members
        # was checked pair by pair again for each candidate)
        old = {n.name for n in g.nodes} if self._clean.get(tuple(n.name for n in g.nodes)) == space else set()
        for c in m.nodes:
            for buf, got in self._loads_in(m, c, ranges, members):
                if c.name in old and buf in old:
                    continue
                p = members[buf]
                want = self._cached(p, m, "own", lambda: ir.simplify_index(ir.offset_of(m.own_index(p), p.stride),
                                                                           ranges))
                if not ir.same_expr(want, got):
                    return Refusal("same-index", f"{label(c)} reads {label(p)} at other positions (a transpose, "
                                   f"broadcast or shifted view), which one loop iteration does not have")
        key = tuple(members)
        if key not in self._clean:
            for name in key:
                self._clean_of.setdefault(name, []).append(key)
        self._clean[key] = space
        return None

    def _loads_in(self, m: KernelGroup, c: ComputeNode, ranges: dict, of: Any = None) -> list[tuple[str, Expr]]:
        """(buffer, offset) of each load of member `c` from a buffer in `of` (default: any),
        in kernel `m`'s loop variables."""
        loads = self._loads(c)
        if not loads:
            return []

        def in_loop() -> dict:
            body_size = c.full_size if c.is_reduction else c.size
            cidx = m.full_index(body_size) if m.level(c) in ("full", "reduction") else m.outer_index(c.size)
            return {ir.index_var("d", i): v for i, v in enumerate(cidx)}

        sub = self._cached(c, m, "index", in_loop)
        # each load simplified when asked for: a kernel's members mostly read buffers from
        # outside it, which no caller here asks about (a DenseNet layer's cat reads the last
        # cat through a clamped channels-last index: 3 ms of sympy each, 4 s of a compile)
        return [(buf, self._cached(c, m, ("load", i), lambda: ir.simplify_index(ir.substitute(index, sub), ranges)))
                for i, (buf, index) in enumerate(loads) if of is None or buf in of]

    def _cached(self, node: ComputeNode, m: KernelGroup, what: Any, make: Callable[[], Any]) -> Any:
        """`make()` for `node` in kernel `m`'s loop space, computed once per space."""
        per = ir.analysis_of(self.g, node)[3]
        key = (what, space_key(m))
        got = per.get(key)
        if got is None:
            got = per[key] = make()
        return got

    def _reads_alike(self, g: KernelGroup, new: Sequence[ComputeNode], shared: set[str]) -> bool:
        """Whether a node of `new`, in the loop of `g` with `new`, reads one of the `shared`
        buffers a member of `g` reads, at the same element: one load serves both, so the
        buffer is read once instead of twice. Attention's saved probabilities feed both the
        softmax backward (a row sum) and their cast for the bmm of the value gradient:
        100 MB read twice a layer in BERT."""
        m = self._merged(g, new)
        ranges = m.ranges()
        mine = [load for n in new for load in self._loads_in(m, n, ranges, shared)]
        for c in g.nodes:
            for buf, e in self._loads_in(m, c, ranges, shared):
                if any(b == buf and ir.same_expr(e, got) for b, got in mine):
                    return True
        return False

    def _loads(self, c: ComputeNode) -> list:
        """ir.record_loads of a node, traced once (each candidate fusion asks again for
        every member)."""
        return ir.traced_loads(self.g, c)

    def needs(self, g: KernelGroup, new: Sequence[ComputeNode]) -> tuple[set[int], int, int]:
        """The step indices of `g`'s members and `new`, their mask, and the mask of what they
        need from outside them: the steps they read and those steps' ancestors."""
        members = {self.index[n.name] for n in g.nodes} | {self.index[n.name] for n in new}
        reach = 0
        for i in members:
            for d in self.deps[i]:
                if d not in members:
                    reach |= (1 << d) | self.anc[d]
        return members, sum(1 << i for i in members), reach

    def rule_no_cycle(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        """A kernel runs as one unit, so everything any member needs runs before all
        of them. Fusing is a cycle when a path leaves the members and comes back,
        through single steps or through other kernels, which run whole too (two
        horizontally fused kernels can each be acyclic and still need each other)."""
        members, mmask, reach = self.needs(g, new)
        below = 0  # the steps that need a member
        for i in members:
            below |= self.desc[i]
        below &= ~mmask
        if not reach & mmask:
            merging = {id(g)} | {id(self.group_of[n.name]) for n in new if n.name in self.group_of}
            # a kernel brings a member into `reach` only through a step of its own that needs
            # one (its mask and its steps' ancestors are what it adds): with none, no cycle
            needing = below & self._grouped
            for k in merging:
                needing &= ~self._unit_masks.get(k, (0, 0))[0]
            if not needing:
                return None
            others = [v for k, v in self._unit_masks.items() if k not in merging]
            grown = True
            while grown and not reach & mmask:
                grown = False
                outside = ~reach
                for gmask, gall in others:
                    if reach & gmask and gall & outside:
                        reach |= gall
                        outside = ~reach
                        grown = True
            if not reach & mmask:
                return None
        # the first step outside the members that needs one of them
        first = reach & below
        through = (first & -first).bit_length() - 1 if first else None
        where = label(self.steps[through]) if through is not None else "another kernel"
        return Refusal("cycle", f"fusing would create a cycle through {where}, which needs one of these results "
                       "and produces (or runs in one kernel with) an input of another")

    def _track(self, g: KernelGroup) -> None:
        """Record a kernel's member mask and the union of its members' ancestors."""
        mask = anc = 0
        for n in g.nodes:
            i = self.index[n.name]
            mask |= 1 << i
            anc |= self.anc[i]
        self._unit_masks[id(g)] = (mask, mask | anc)
        self._grouped |= mask

    PEAK_WINDOW = 400  # steps simulated at most; wider gaps are refused as too far apart
    PEAK_SLACK = 64 * 1024  # bytes of extra peak tolerated (a few rows of scratch)

    def rule_peak_memory(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        """A kernel runs where all its inputs are ready. Fusing work from far later in
        the graph either computes its result early (that buffer then stays live across
        everything in between) or delays the earlier members (their inputs stay live):
        both can raise the peak. Simulate the live bytes over the steps in between, with
        and without the fusion, and refuse when the peak grows past both the window's
        own and the whole graph's peak run op by op (a backward's peak is where all
        saved activations are live: a later window may grow below it)."""
        a = {self.index[n.name] for n in g.nodes}
        b = {self.index[n.name] for n in new}
        lo, hi = min(a | b), max(a | b)
        if all(j in a or j in b for j in range(lo, hi + 1)):
            return None  # nothing in between: fusing only removes a buffer
        if hi - lo > self.PEAK_WINDOW:
            return Refusal("peak-memory", f"{label(self.steps[max(b)])} comes {hi - lo} ops after "
                           f"{label(self.steps[min(a)])}; fusing across that many ops could keep buffers alive "
                           "much longer than eager")
        joining = {c for c in self._joining_later(g, new, max(b)) if c - lo <= self.PEAK_WINDOW}
        end = max(joining | {hi})
        # A window's simulated peak is at most what is live before it (which includes every
        # producer it reads from earlier) plus all it makes; a refusal needs that peak plus
        # what is live before it above the graph's. Most windows lie far below the graph's
        # peak (a forward's start, a backward's end): no simulation decides otherwise
        # (BERT training: 0.45 of 1.2 s of scheduling went to these simulations).
        made = self._bytes_upto[end + 1] - self._bytes_upto[lo]
        if 2 * self._live_before[lo] + made <= self.graph_peak:
            return None
        after = self._peak(lo, end, [a | b | joining])
        if after + self._live_before[lo] <= self.graph_peak:
            return None  # below the graph's peak whatever the window's own was
        before = self._peak(lo, end, [a, b])
        if after > before + self.PEAK_SLACK:
            return Refusal("peak-memory", f"fusing would raise peak memory from {mb(before)} to {mb(after)}: "
                           f"{label(self.steps[max(b)])} would run together with {label(self.steps[min(a)])}, "
                           f"across {hi - lo + 1 - len(a | b)} ops in between, keeping their buffers alive longer")
        return None

    def _joining_later(self, g: KernelGroup, new: Sequence[ComputeNode], after: int) -> set[int]:
        """Steps after `after` that compute in the fused kernel's space from nothing but
        its members, each other and values made before it: the scheduler meets them next
        and fuses them too, so the peak is judged with them in the kernel (what they store
        is then made early too). Judged without them, a softmax's `x - max` raised the
        peak by the values it would compute early, while the scores (also read by the
        later test for all -inf rows) counted as stored: T5's softmaxes split in two
        kernels. A reader that also waits for a later step (the next layer's matmul)
        does not join."""
        merged = self._merged(g, new)
        inside = {self.index[n.name] for n in merged.nodes}
        lo = min(inside)
        joining: set[int] = set()
        frontier = list({c for j in inside for c in self.users[j] if c > after})
        heapq.heapify(frontier)  # in step order: a step's producers are decided before it
        seen: set[int] = set()
        while frontier:
            c = heapq.heappop(frontier)
            if c in seen:
                continue
            seen.add(c)
            step = self.steps[c]
            if not isinstance(step, ComputeNode) or not ir.same_sizes(loop_space(step)[0], merged.full):
                continue
            if all(d in inside or d in joining or d < lo for d in self.deps[c]):
                joining.add(c)
                for u in self.users[c]:
                    heapq.heappush(frontier, u)
        return joining

    def _peak(self, lo: int, hi: int, sets: Sequence[set[int]]) -> int:
        """Peak live bytes over steps lo..hi when each set in `sets` runs as one kernel
        (placed as early as its inputs allow, like `_order`), other steps alone."""
        unit_of: dict[int, tuple] = {}
        for k, st in enumerate(sets):
            for j in st:
                unit_of[j] = ("k", k)
        members: dict[Any, list[int]] = {}  # each unit's steps, units in step order
        for j in range(lo, hi + 1):
            members.setdefault(unit_of.get(j, ("s", j)), []).append(j)
        order = self._unit_order(lo, hi, unit_of, members)
        if order is None:
            return 0  # a cycle (rule_no_cycle reports it)
        pos = {j: t for t, u in enumerate(order) for j in members[u]}
        return self._peak_of_order(lo, hi, unit_of, pos, len(order))

    def _unit_order(self, lo: int, hi: int, unit_of: dict[int, tuple],
                    members: dict[Any, list[int]]) -> Optional[list[Any]]:
        """The units of the window, each as early as its inputs allow (of those ready, the
        first in step order); None on a cycle. A heap of the ready ones: picking by a scan
        from the start each time was quadratic in a window of up to PEAK_WINDOW steps."""
        units = list(members)
        rank = {u: k for k, u in enumerate(units)}
        waiting = [0] * len(units)
        readers: list[list[int]] = [[] for _ in units]
        for k, u in enumerate(units):
            seen: set = set()
            for j in members[u]:
                for d in self.deps[j]:
                    if lo <= d <= hi:
                        v = unit_of.get(d, ("s", d))
                        if v != u and v not in seen:
                            seen.add(v)
                            readers[rank[v]].append(k)
            waiting[k] = len(seen)
        ready = [k for k in range(len(units)) if not waiting[k]]
        heapq.heapify(ready)
        order: list[Any] = []
        while ready:
            k = heapq.heappop(ready)
            order.append(units[k])
            for r in readers[k]:
                waiting[r] -= 1
                if not waiting[r]:
                    heapq.heappush(ready, r)
        return order if len(order) == len(units) else None

    def _peak_of_order(self, lo: int, hi: int, unit_of: dict[int, tuple], pos: dict[int, int], end: int) -> int:
        """Peak live bytes when step j of the window runs at position pos[j] (of `end`)."""
        born: list[int] = [0] * (end + 1)
        dies: list[int] = [0] * (end + 2)

        def last_read(readers: Sequence[int], to_end: bool, default: int) -> int:
            """Position of the last reader in the window, or `end` if it is held past it."""
            if to_end or (readers and max(readers) > hi):
                return end
            return max((pos[r] for r in readers if r >= lo), default=default)

        mem_users, nbytes, out_steps = self.mem.users, self.nbytes, self.out_steps
        # buffers made before the window and read inside it
        outside_producers = {d for j in range(lo, hi + 1) for d in self.mem.deps[j] if d < lo}
        for d in outside_producers:
            born[0] += nbytes[d]
            dies[last_read(mem_users[d], d in out_steps, -1) + 1] += nbytes[d]
        # inputs the graph releases, read inside the window
        for b in {b for j in range(lo, hi + 1) for b in self.mem.released_read_by[j]}:
            born[0] += self.g.nbytes(b)
            dies[last_read(self.mem.released_readers[b], False, -1) + 1] += self.g.nbytes(b)
        for j in range(lo, hi + 1):
            u = unit_of.get(j)  # a kernel of `sets`; None: a step alone
            users = self.users[j]
            if u is not None and users and j not in out_steps and isinstance(self.steps[j], ComputeNode) and all(
                    unit_of.get(c) == u for c in users):
                continue  # stays inside the kernel: never materialized
            born[pos[j]] += nbytes[j]
            dies[last_read(mem_users[j], j in out_steps, pos[j]) + 1] += nbytes[j]
        live = peak = 0
        for t in range(end):
            live += born[t] - dies[t]
            if live > peak:
                peak = live
        return peak

    RULES: tuple[str, ...] = ("rule_enabled", "rule_iteration_space", "rule_epilogue", "rule_size",
                              "rule_no_cycle", "rule_same_index", "rule_peak_memory")

    def check(self, g: KernelGroup, new: Sequence[ComputeNode]) -> Optional[Refusal]:
        for rule in self.RULES:
            r = getattr(self, rule)(g, new)
            if r is not None:
                return r
        return None

    # -- the greedy pass ------------------------------------------------------
    def run(self) -> Schedule:
        groups: list[KernelGroup] = []
        for i, step in enumerate(self.steps):
            if not isinstance(step, ComputeNode):
                continue
            producer_groups: list[KernelGroup] = []
            for j in sorted(self.deps[i], reverse=True):
                pg = self.group_of.get(self.steps[j].name)
                if pg is not None and pg not in producer_groups:
                    producer_groups.append(pg)
            target = None
            for pg in producer_groups:
                ref = self.check(pg, [step])
                joins = lambda pg=pg: self.check(pg, [step]) is None  # noqa: E731
                if ref is not None and ref.rule == "same-index" and (
                        self._in_memory_order([step], joins) or self._kernel_in_memory_order(pg, joins)):
                    ref = None
                if ref is None:
                    target = pg
                    break
                self._decide(pg, step, ref)
            if target is not None:
                reason = join_reason(target, step)
                self._decide(target, step, reason)
                self._join(target, [step], reason)
                target = self._pull_in_producers(step, target, producer_groups, groups)
                if self.opt.fusion and self.opt.horizontal_fusion:
                    self._pull_in_shared_reader(i, step, target, groups)
                continue
            if self.opt.fusion and self.opt.horizontal_fusion:
                target = self._join_horizontally(i, step, groups, producer_groups)
            if target is None:
                full, rflags = loop_space(step)
                ng = KernelGroup([step], full, rflags, reasons=[f"{label(step)}: {step.describe()}"])
                groups.append(ng)
                self.group_of[step.name] = ng
                self._track(ng)
        return self._finish(groups)

    def _pull_in_producers(self, step: ComputeNode, target: KernelGroup, producer_groups: list[KernelGroup],
                           groups: list[KernelGroup]) -> KernelGroup:
        """After `step` joined `target`: its other producers' kernels merged with it when the
        rules allow; the kernel `step` ends up in."""
        for pg in producer_groups:
            if pg is target or pg not in groups:
                continue
            ref = self.check(target, pg.nodes)
            if ref is None:
                reason = f"{label(step)} needs both: merged kernels"
                self._decide(pg, step, reason)
                self._join(target, pg.nodes, reason)
                groups.remove(pg)
                del self._unit_masks[id(pg)]
            elif self._epilogue_of(pg, target):
                # the rules are not symmetric: a reduction's kernel takes pointwise work over
                # its rows as an epilogue, a pointwise kernel cannot take the reduction.
                # BatchNorm's running-statistics update reads the batch mean (the row
                # pass's) and the old running mean (an input, scaled in a kernel of its
                # own): joined that kernel first, it left two per-channel buffers and a
                # kernel per layer
                reason = f"{label(step)} needs both: merged kernels, as the reduction's epilogue"
                self._decide(pg, step, reason)
                self._join(pg, target.nodes, reason)
                groups.remove(target)
                del self._unit_masks[id(target)]
                target = pg
            else:
                self._decide(pg, step, ref)
        return target

    def _epilogue_of(self, red: KernelGroup, pw: KernelGroup) -> bool:
        """Whether pointwise kernel `pw` joins reduction kernel `red` as its epilogue: when
        the rules allow it and a result of `red` that only `pw` reads then stays in
        registers. Otherwise `pw` may still join a later kernel (cross-entropy's pick of
        the label's logit joins the loss's sum, and stores nothing)."""
        if red.rflags is not None and pw.rflags is None and self._only_read_by(red, pw):
            return self.check(red, pw.nodes) is None
        return False

    def _only_read_by(self, g: KernelGroup, other: KernelGroup) -> bool:
        """Whether a member of `g` that is not a graph output is read by `other` alone."""
        names = {n.name for n in g.nodes} | {n.name for n in other.nodes}
        theirs = {n.name for n in other.nodes}
        for n in g.nodes:
            readers = [self.steps[j].name for j in self.readers_of.get(n.name, ())]
            if (n.name not in self.output_sources and readers and any(r in theirs for r in readers)
                    and all(r in names for r in readers)):
                return True
        return False

    def _join_horizontally(self, i: int, step: ComputeNode, groups: list[KernelGroup],
                           producer_groups: list[KernelGroup]) -> Optional[KernelGroup]:
        """The kernel `step` joined with no buffer between them, if one may take it."""
        for cand in self._horizontal_candidates(i, step, groups):
            if cand in producer_groups:
                continue
            same = same_space(cand, step)
            shared = step.reads & set().union(*(n.reads for n in cand.nodes))
            if not same and not shared:
                continue  # other loops and no shared input: nothing to gain
            chain = self.g.chains.get(step.name, 1)
            if chain > 1 and len(cand.nodes) + chain > self.opt.max_fusion_size:
                continue  # a list element's chain starts where it fits whole (list_order.py)
            legal = self.check(cand, [step]) is None
            if legal and same:
                self._join(cand, [step], join_reason(cand, step) + " (horizontal fusion: no buffer "
                           "between them, same loops)")
                return cand
            how = self._one_read_of(cand, [step], shared, legal) if shared else None
            if how is not None:
                self._join(cand, [step], f"{label(step)}: reads what the kernel reads, {how}")
                return cand
        return None

    def _one_read_of(self, g: KernelGroup, new: Sequence[ComputeNode], shared: set[str],
                     legal: bool) -> Optional[str]:
        """How kernel `g` with `new` (`legal`: the rules allow it as they loop now) reads
        a `shared` buffer once, in a decision's words; None when it cannot."""
        if legal and self._reads_alike(g, new, shared):
            return "at the same elements (horizontal fusion: one read of their shared input)"
        if self._alike_in_memory_order(g, new, shared):
            return ("at the same elements, looped in its output's memory order (horizontal fusion: one read of "
                    "their shared input)")
        return None

    def _alike_in_memory_order(self, g: KernelGroup, new: Sequence[ComputeNode], shared: set[str]) -> bool:
        """Whether kernel `g` may take `new`, reading a `shared` buffer at the same elements,
        once a lone pointwise node of either side loops in its output's memory order
        (`_in_memory_order`; the node keeps that order if so)."""
        def joins() -> bool:
            return self.check(g, new) is None and self._reads_alike(g, new, shared)

        if len(new) == 1 and self._in_memory_order(new, joins):
            return True
        return len(g.nodes) == 1 and g.rflags is None and self._in_memory_order(g.nodes, joins, g)

    def _pull_in_shared_reader(self, i: int, step: ComputeNode, target: KernelGroup,
                               groups: list[KernelGroup]) -> None:
        """After `step` joined its producer's kernel `target`: an earlier kernel that reads
        what `step` reads, at the same elements, merged into `target` when the rules allow,
        so that the shared buffer is read once. An attention backward whose incoming
        gradient is cast in a kernel of its own: the softmax backward joins that kernel,
        while the cast of the saved probabilities for the value gradient's bmm, a kernel
        made before it, read the probabilities a second time."""
        for cand in self._horizontal_candidates(i, step, groups):
            if cand is target or cand not in groups:
                continue
            shared = step.reads & set().union(*(n.reads for n in cand.nodes))
            if not shared:
                continue
            how = self._one_read_of(target, cand.nodes, shared, self.check(target, cand.nodes) is None)
            if how is None:
                continue
            self._join(target, cand.nodes, f"{label(cand.nodes[0])}: reads what {label(step)} reads, {how}")
            groups.remove(cand)
            del self._unit_masks[id(cand)]
            return

    def _horizontal_candidates(self, i: int, step: ComputeNode, groups: list[KernelGroup]) -> list[KernelGroup]:
        """Kernels `step` may join without a buffer between them: the last few made, and
        any kernel reading what `step` reads (however long ago: in a backward, the value
        branch of attention runs between the cast of the probabilities and their
        softmax backward), most recent first."""
        out = list(reversed(groups[-8:]))
        for b in step.reads:
            for j in reversed(self.readers_of.get(b, [])):
                g = self.group_of.get(self.steps[j].name) if j < i else None
                if g is not None and g not in out:
                    out.append(g)
        return out

    def _in_memory_order(self, nodes: Sequence[ComputeNode], accept: Callable[[], bool],
                         group: Optional[KernelGroup] = None) -> bool:
        """Whether `accept()` holds once pointwise `nodes`, laid out alike, loop over their
        dims in their outputs' memory order; they keep that order if so (`group`: the
        kernel they are all the members of, whose loops are theirs). Eager's `_to_copy`
        keeps its input's layout: the cast of attention's probabilities, transposed for a
        bmm, is the probabilities' memory in the probabilities' order. Looped in its
        logical (transposed) order it reads them at other positions than their softmax
        kernel computes them, or than the softmax backward reads them; looped in memory
        order it joins that kernel."""
        first = nodes[0]
        order = None if first.is_reduction else ir.memory_order(first)
        if order is None or any(n.is_reduction or not ir.same_sizes(n.size, first.size) or ir.memory_order(n) != order
                                for n in nodes[1:]):
            return False
        saved = [(n.size, n.stride, n.body, n.loop_order) for n in nodes]
        full = group.full if group is not None else None
        for n in nodes:
            ir.permute_loops(n, order)
            self._forget(n)
        if group is not None:
            group.full = loop_space(first)[0]
        if accept():
            return True
        for n, (size, stride, body, loop_order) in zip(nodes, saved):
            n.size, n.stride, n.body, n.loop_order = size, stride, body, loop_order
            self._forget(n)
        if group is not None:
            group.full = full
        return False

    def _kernel_in_memory_order(self, group: KernelGroup, accept: Callable[[], bool]) -> bool:
        """Whether `accept()` holds once every member of pointwise kernel `group` loops in
        its output's memory order (all alike); the kernel keeps that order if so. A
        ConvNeXt stage's last residual sum is NCHW by its dims over NHWC memory, and the
        downsampling's LayerNorm reads it permuted to NHWC: in its logical order the sum's
        kernel is read at other positions, in memory order the LayerNorm's kernel computes
        it (as Inductor's does)."""
        if group.rflags is not None or not group.nodes or not self._in_memory_order(group.nodes, accept, group):
            return False
        group.reasons.append(f"the kernel loops over {fmt_sizes(group.full)}, its outputs' memory order, "
                             "where the next reads them")
        return True

    def _forget(self, node: ComputeNode) -> None:
        """Drop what was traced of `node`'s body: its loops were just reordered."""
        self.g.node_analysis.pop(node.name, None)
        for key in self._clean_of.pop(node.name, ()):  # (a dict rebuilt per call: 0.8 s of DenseNet's)
            self._clean.pop(key, None)

    def _decide(self, g: KernelGroup, consumer: ComputeNode, outcome: Refusal | str) -> None:
        """Record the outcome of trying `consumer` with kernel `g` (a Refusal, or the
        join reason) for each member of `g` that `consumer` reads: those are the
        edges the outcome explains. Horizontal joins have no such edge."""
        mine = self.index[consumer.name]
        for n in g.nodes:
            if self.index[n.name] not in self.deps[mine]:
                continue
            if isinstance(outcome, Refusal):
                self.decisions.append(Decision("not_fused", n.name, consumer.name, outcome.rule, outcome.reason,
                                               outcome.option))
            else:
                self.decisions.append(Decision("fused", n.name, consumer.name, "fused", outcome))

    def _join(self, g: KernelGroup, new: Sequence[ComputeNode], reason: str) -> None:
        m = self._merged(g, new)
        g.nodes, g.full, g.rflags = m.nodes, m.full, m.rflags
        g.reasons.append(reason)
        for n in new:
            self.group_of[n.name] = g
        self._track(g)

    def _finish(self, groups: list[KernelGroup]) -> Schedule:
        # what each group must write to memory
        for s in self.steps:
            mine = self.group_of.get(s.name)
            for r in s.reads:
                pg = self.group_of.get(r)
                if pg is not None and pg is not mine:
                    pg.stores.add(r)
        for name in self.output_sources:
            if name in self.group_of:
                self.group_of[name].stores.add(name)
        units = self._order(groups)
        counter = 0
        for u in units:
            if isinstance(u, KernelGroup):
                u.name = kernel_name(u, counter, self.kernel_prefix)
                counter += 1
        return Schedule(units, [u for u in units if isinstance(u, KernelGroup)], self.decisions, self.group_of)

    def _order(self, groups: list[KernelGroup]) -> list[Any]:
        """Topological order of kernels and externs, earliest graph position first."""
        unit_of: dict[int, Any] = {}
        for g in groups:
            for n in g.nodes:
                unit_of[self.index[n.name]] = g
        units: list[Any] = []
        for i, s in enumerate(self.steps):
            u = unit_of.get(i, s)
            if u not in units:
                units.append(u)
        pos = {id(u): k for k, u in enumerate(units)}
        udeps: dict[int, set[int]] = {id(u): set() for u in units}
        for i in range(len(self.steps)):
            u = unit_of.get(i, self.steps[i])
            for j in self.deps[i]:
                v = unit_of.get(j, self.steps[j])
                if v is not u:
                    udeps[id(u)].add(id(v))
        done: set[int] = set()
        out: list[Any] = []
        remaining = list(units)
        while remaining:
            for k, u in enumerate(remaining):
                if udeps[id(u)] <= done:
                    out.append(u)
                    done.add(id(u))
                    del remaining[k]
                    break
            else:  # cannot happen: rule_no_cycle forbids it
                raise RuntimeError("fuselens scheduler produced a cycle")
        del pos
        return out


def transitive_edges(deps: Sequence[set[int]], users: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Each step's transitive ancestors and descendants as bitmasks (steps in graph order)."""
    anc: list[int] = []
    for d in deps:
        mask = 0
        for j in d:
            mask |= anc[j] | (1 << j)
        anc.append(mask)
    desc = [0] * len(deps)
    for i in range(len(deps) - 1, -1, -1):
        mask = 0
        for u in users[i]:
            mask |= desc[u] | (1 << u)
        desc[i] = mask
    return anc, desc


def schedule(graph: GraphIR, options: Any, output_sources: set[str], kernel_prefix: str = "cpp_fused") -> Schedule:
    """Fuse the graph's steps into kernels named `<kernel_prefix>_<ops>_<n>` (the target's prefix)."""
    return Scheduler(graph, options, output_sources, kernel_prefix).run()
