"""Where each step of a graph's plan runs, for a lower peak memory.

The schedule's order is the FX graph's, give or take fusion; two moves improve on it:
- **hoist**: a step that frees at least what it allocates runs right after the steps
  it reads (with the views it reads), so that it holds its output, not its inputs,
  while the steps it no longer waits for run;
- **sink**: a step whose outputs wait for a late reader (a gradient only the caller
  reads waits for the graph's end) runs just before that reader, when the inputs
  whose lives this lengthens weigh at most what it allocates: it then holds them, not
  its outputs, while the steps between run, and its own moment (inputs and outputs
  alive together) comes where less is alive.

A step that moves allocates next to what is alive where it lands: at a backward's
start, where every saved activation is still alive, even a step that frees as much as
it allocates raises the peak (ResNet-50's input image copied to channels-last, 9 MB,
for the first convolution's gradient at the backward's end, was the step's peak
there). So every move is replayed op by op over the steps it passes and kept only if
the graph's peak does not rise.

Kernels move, and pure library calls (`MOVABLE_LIBRARY_CALLS`); other library calls
keep their order (random number generators, collectives).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Callable, Optional

import torch

from fuselens.compiler.ir import GraphIR
from fuselens.compiler.runtime.interpreter import ExternCall, KernelCall

# A step is hoisted when it frees this much and this share of what it allocates (a padded
# copy is a little larger than what it pads; a column sum's partials are tiny next to the
# activation it frees), and sunk when it allocates this much (smaller ones cannot matter at
# a peak).
MIN_BYTES = 1 << 20
HOIST_SLACK = 0.99

# Library calls that move like kernels: pure functions of their arguments into fresh outputs.
MOVABLE_LIBRARY_CALLS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
                         torch.ops.aten.baddbmm.default, torch.ops.aten.convolution.default,
                         torch.ops.aten.convolution_backward.default}


def step_outputs(step: Any) -> list[str]:
    """The buffers a plan step makes (a view step makes its view)."""
    if isinstance(step, KernelCall):
        return list(step.outputs)
    if isinstance(step, ExternCall):
        return [o for o in (step.outputs if isinstance(step.outputs, list) else [step.outputs]) if o is not None]
    return []


def step_buffers(step: Any) -> list[str]:
    """Every buffer a plan step touches: what it reads and writes, and an input a kernel
    overwrites in place."""
    if isinstance(step, KernelCall):
        return list(step.buffers) + list(step.reuse.values())
    if isinstance(step, ExternCall):
        return list(buffers_in((step.args, step.kwargs))) + step_outputs(step)
    return []


def buffers_in(a: Any):
    """The buffer names in a plan step's (nested) arguments."""
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "buf":
        yield a[1]
    elif isinstance(a, (list, tuple)):
        for x in a:
            yield from buffers_in(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from buffers_in(x)


class PlanOrder:
    """A plan's steps with what each touches, and its memory replayed op by op.

    `root` maps a buffer to the one whose memory it shares (a view to its base);
    `views` are the steps that re-create views (no memory of their own); `freeable`
    are the buffers whose memory the graph releases after their last use (its
    intermediates, and the inputs it may release: a backward's saved activations)."""

    def __init__(self, plan: list[Any], graph: GraphIR, root: Callable[[str], str], views: set[str],
                 freeable: set[str]) -> None:
        self.plan, self.g, self.root, self.views, self.freeable = plan, graph, root, views, freeable
        self.inputs = {x.name for x in graph.inputs}
        self._sizes: dict[str, int] = {}
        # per step (by id: steps do not change while they move): the roots it touches, what it allocates
        self._roots: dict[int, list[str]] = {}
        self._allocs: dict[int, list[str]] = {}
        self._index()

    def hoist(self) -> None:
        """Walks from the start: a step moved up is not looked at again."""
        i = 0
        while i < len(self.plan):
            move = self._hoist_target(i) if self.movable(self.plan[i]) else None
            if move is not None:
                to, along = move
                # after the steps there that free more than they allocate, and allocate less
                # than this one: each then runs while less is alive (ViT: a weight gradient's
                # matmul hoisted ahead of the column sums freeing a saved activation)
                alloc = self._allocates(self.plan[i])
                while to < i and to not in along and self._frees_first(to, alloc):
                    to += 1
                if to < i:
                    moving = set(along) | {i}
                    order = [self.plan[j] for j in along] + [self.plan[i]]
                    order += [self.plan[j] for j in range(to, i + 1) if j not in moving]
                    self._try(to, i, order)
            i += 1

    def _frees_first(self, j: int, alloc: int) -> bool:
        """Whether the step at `j` allocates less than `alloc` and frees at least that."""
        step = self.plan[j]
        if not self.movable(step):
            return False
        made = self._allocates(step)
        frees = sum(self._nbytes(r) for r in self._touched(step) if r in self.freeable and self.touches[r][-1] == j)
        return made < alloc and frees >= made

    def sink(self) -> None:
        """Walks from the end, so that a chain (a weight gradient's matmul, then its
        cast) goes down together."""
        for i in range(len(self.plan) - 1, -1, -1):
            to = self._sink_target(i) if self.movable(self.plan[i]) else None
            if to is not None:
                self._try(i, to - 1, self.plan[i + 1:to] + [self.plan[i]])

    def movable(self, step: Any) -> bool:
        if isinstance(step, KernelCall):
            return True
        return (isinstance(step, ExternCall) and step.target in MOVABLE_LIBRARY_CALLS
                and step.name not in self.views)

    def _nbytes(self, b: str) -> int:
        n = self._sizes.get(b)
        if n is None:
            n = self._sizes[b] = self.g.nbytes(b) if b in self.g.buffers else 0
        return n

    def _made(self, step: Any) -> list[str]:
        """The buffers `step` allocates (not views, not aliases of its inputs)."""
        made = self._allocs.get(id(step))
        if made is None:
            made = self._allocs[id(step)] = [o for o in step_outputs(step)
                                             if o not in self.views and self.root(o) == o and o in self.g.buffers]
        return made

    def _allocates(self, step: Any) -> int:
        """Bytes `step` allocates: its outputs that are neither views nor aliases of its inputs."""
        return sum(self._nbytes(o) for o in self._made(step))

    def _touched(self, step: Any) -> list[str]:
        """The root buffers `step` touches, each once."""
        roots = self._roots.get(id(step))
        if roots is None:
            roots = self._roots[id(step)] = list(dict.fromkeys(self.root(b) for b in step_buffers(step)))
        return roots

    def _index(self) -> None:
        """Which step makes each buffer, which steps touch each root, and the memory
        alive while each step runs (its outputs allocated, its dying inputs not yet freed)."""
        self.producer: dict[str, int] = {}
        self.touches: dict[str, list[int]] = {}
        for j, s in enumerate(self.plan):
            for o in step_outputs(s):
                self.producer[o] = j
            for r in self._touched(s):
                self.touches.setdefault(r, []).append(j)
        n = len(self.plan)
        grow, shrink = [0] * n, [0] * n
        seen: set[str] = set()
        for j, s in enumerate(self.plan):
            for o in self._made(s):
                if o not in seen:
                    seen.add(o)
                    grow[j] += self._nbytes(o)
        for r, t in self.touches.items():
            if r in self.freeable:
                shrink[t[-1]] += self._nbytes(r)
        mem = sum(self._nbytes(x) for x in self.inputs & self.freeable)
        self.before, self.during = [0] * n, [0] * n
        for j in range(n):
            self.before[j] = mem
            mem += grow[j]
            self.during[j] = mem
            mem -= shrink[j]
        self._maxima()

    def _maxima(self) -> None:
        self.peak = max(self.during, default=0)
        self._max_to = list(accumulate(self.during, max))
        self._max_from = list(accumulate(reversed(self.during), max))[::-1]

    def _try(self, lo: int, hi: int, order: list[Any]) -> bool:
        """Put `order` (the steps lo..hi, rearranged) in their place if the graph's peak
        does not rise. Only what the steps lo..hi touch is indexed again."""
        outside = max(self._max_to[lo - 1] if lo > 0 else 0, self._max_from[hi + 1] if hi + 1 < len(self.plan) else 0)
        before, during = self._replay(lo, hi, order)
        if max(outside, max(during)) > self.peak:
            return False
        self.plan[lo:hi + 1] = order
        self.before[lo:hi + 1], self.during[lo:hi + 1] = before, during
        roots = {r for s in order for r in self._touched(s)}
        for r in roots:
            self.touches[r] = [t for t in self.touches[r] if t < lo or t > hi]
        for k, s in enumerate(order, lo):
            for o in step_outputs(s):
                self.producer[o] = k
            for r in self._touched(s):
                self.touches[r].append(k)
        for r in roots:
            self.touches[r].sort()
        self._maxima()
        return True

    def _replay(self, lo: int, hi: int, order: list[Any]) -> tuple[list[int], list[int]]:
        """The memory alive before and while each step of `order` runs, in place of the
        steps lo..hi."""
        last: dict[str, int] = {}
        for k, s in enumerate(order):
            for r in self._touched(s):
                last[r] = k
        mem, made = self.before[lo], set()
        before, during = [0] * len(order), [0] * len(order)
        for k, s in enumerate(order):
            before[k] = mem
            for o in self._made(s):
                if o not in made:
                    made.add(o)
                    mem += self._nbytes(o)
            during[k] = mem
            for r in self._touched(s):
                if last[r] == k and r in self.freeable and self.touches[r][-1] <= hi:
                    mem -= self._nbytes(r)
        return before, during

    def _views_read(self, step: Any, before: int) -> list[int]:
        """The view steps (before `before`) that make what `step` reads, and theirs in turn."""
        found: set[int] = set()
        todo = [b for b in step_buffers(step) if b not in step_outputs(step)]
        while todo:
            j = self.producer.get(todo.pop())
            if j is None or j >= before or j in found or self.plan[j].name not in self.views:
                continue
            found.add(j)
            todo.extend(buffers_in((self.plan[j].args, self.plan[j].kwargs)))
        return sorted(found)

    def _hoist_target(self, i: int) -> Optional[tuple[int, list[int]]]:
        """Where the step at `i` moves up to, if it frees there at least what it
        allocates, and the view steps that move with it: right after the steps it reads
        when it frees enough there, else right after the last other step touching what
        it frees (ViT's last LayerNorm: its column sums read a saved activation that the
        LayerNorm's row kernel reads too, and waited behind a weight gradient's matmul)."""
        step = self.plan[i]
        outs = step_outputs(step)
        alloc = self._allocates(step)
        views = self._views_read(step, i)
        own = {o for j in views for o in step_outputs(self.plan[j])} | set(outs)
        reads = {b for s in [step, *(self.plan[j] for j in views)] for b in step_buffers(s)} - own
        after = 1 + max((self.producer[b] for b in reads if b in self.producer), default=-1)
        need = max(alloc * HOIST_SLACK, MIN_BYTES)
        last_other: dict[str, int] = {}  # what this step frees -> the last other step touching it
        for r in {self.root(b) for b in reads} & self.freeable:
            others = [t for t in self.touches.get(r, []) if t != i and t not in views]
            if all(t < i for t in others):
                last_other[r] = max(others, default=-1)
        for to in sorted({after, *(t + 1 for t in last_other.values() if t + 1 > after)}):
            if to >= i:
                break
            freed = sum(self._nbytes(r) for r, t in last_other.items() if t < to)
            if freed >= need:
                return to, sorted(j for j in views if j >= to)
        return None

    def _sink_target(self, i: int) -> Optional[int]:
        """The first step after `i` that touches what the step at `i` makes (or the
        plan's end), if the step moves down to just before it."""
        step = self.plan[i]
        outs = step_outputs(step)
        alloc = self._allocates(step)
        if alloc < MIN_BYTES:
            return None
        made = {self.root(o) for o in outs}
        to = min((t for r in made for t in self.touches.get(r, []) if t > i), default=len(self.plan))
        if to <= i + 1:
            return None
        longer = 0  # the inputs that now die later
        for r in (set(self._touched(step)) - made) & self.freeable:
            if all(t < to for t in self.touches.get(r, []) if t != i):
                longer += self._nbytes(r)
        return to if longer <= alloc else None
