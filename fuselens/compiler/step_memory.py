"""What each step of a lowered graph stores, and who keeps it alive: the memory model
the scheduler's peak-memory rule (and `early_outputs`) estimates with, op by op in
graph order, before any kernel exists. The run-time plan's order (runtime/plan_order.py)
replays the real buffers later; both count a graph's inputs the same way
(`ir.released_inputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from fuselens.compiler import ir
from fuselens.compiler.ir import ComputeNode, ExternNode, GraphIR


def step_bytes(graph: GraphIR, s: Any) -> int:
    """Bytes a step stores when it runs alone: each output of a library call once (its
    name is among its outputs), nothing for a view (it shares its input's memory)."""
    if isinstance(s, ExternNode) and ir.returns_alias(s.fx_node):
        return 0
    names = dict.fromkeys([s.name] + [o for o in (getattr(s, "outputs", None) or []) if o])
    total = 0
    for n in names:
        if n in graph.buffers:
            total += graph.nbytes(n)
        elif isinstance(s, ComputeNode) and n == s.name:
            total += graph.hint(ir.numel(s.size)) * s.dtype.itemsize
    return total


def op_by_op_liveness(nbytes: Sequence[int], users: Sequence[Sequence[int]], out_steps: set[int],
                      released: Sequence[tuple[int, int]] = ()) -> tuple[list[int], int]:
    """Bytes live before each step, and the peak, when the graph runs op by op in
    order (each buffer from its step to its last reader, outputs to the end; each
    input the graph releases, given as (bytes, last reader), from the start to that
    reader). The bytes before a window over-count what its simulation counts again
    (producers and inputs it reads), which only makes the whole-graph test stricter."""
    n = len(nbytes)
    dies = [0] * (n + 1)
    for j in range(n):
        last = n if j in out_steps else max(users[j], default=j)
        dies[min(last + 1, n)] += nbytes[j]  # dies[n] is never subtracted: live to the end
    for size, last in released:
        dies[min(last + 1, n)] += size
    before, live, peak = [0] * (n + 1), sum(size for size, _ in released), 0
    for t in range(n):
        live -= dies[t]
        before[t] = live
        live += nbytes[t]
        peak = max(peak, live)
    return before, peak


@dataclass
class MemoryEdges:
    """Who keeps each step's buffer alive (step indices, in step order): its readers and
    the readers of its views (`users`, and `deps` the other way); each input the graph
    frees at its last reader, with the steps that read it, directly or through a view
    (`released_readers`, and `released_read_by` per step)."""

    users: list[list[int]]
    deps: list[set[int]]
    released_readers: dict[str, list[int]]
    released_read_by: list[list[str]]


def memory_edges(graph: GraphIR, steps: Sequence[Any], deps: Sequence[set[int]], users: Sequence[Sequence[int]],
                 readers_of: dict[str, list[int]]) -> MemoryEdges:
    """A view stores nothing (`step_bytes`): its readers keep what it views alive.
    Inputs freed at their last reader (a backward's saved activations) count from the
    start: a fusion that delays a reader keeps one alive longer, and near a backward's
    start, where they all are, is its peak (ViT's backward joined its last LayerNorm's
    column sums with the block before's, counted without them)."""
    views = [i for i, s in enumerate(steps) if isinstance(s, ExternNode) and ir.returns_alias(s.fx_node)]
    mem_users: list[list[int]] = [list(u) for u in users]
    for v in reversed(views):  # a view of a view hands its readers on first
        for d in deps[v]:
            mem_users[d] = sorted(set(mem_users[d]) | set(mem_users[v]))
    mem_deps: list[set[int]] = [set() for _ in steps]
    for d, us in enumerate(mem_users):
        for u in us:
            mem_deps[u].add(d)
    is_view = set(views)
    released: dict[str, list[int]] = {}
    for b in sorted(ir.released_inputs(graph)):
        direct = readers_of.get(b, [])
        readers = set(direct).union(*(mem_users[r] for r in direct if r in is_view))
        if readers:
            released[b] = sorted(readers)
    read_by: list[list[str]] = [[] for _ in steps]
    for b, readers in released.items():
        for j in readers:
            read_by[j].append(b)
    return MemoryEdges(mem_users, mem_deps, released, read_by)
