"""Graph outputs computed as soon as what they read is (a step order before scheduling).

A training forward ends with what AOTAutograd's partitioner moved into it from the
backward: values the backward reads, computed in the forward and saved. A LayerNorm's
backward reads its normalized input, which the partitioner recomputes from the
LayerNorm's input, mean and rstd after every layer of the forward; each layer's input
then stays alive until the graph's end. ViT-B/16 training (batch 32, H200): the twelve
residual streams (fp32, 18.5 MB each) were alive together at the forward's end, and its
last kernel computed all twelve saved values at once, 90 MB above Inductor's peak, whose
scheduler fuses each into the LayerNorm's own kernel however far apart they are.

`outputs_early` moves each pointwise step that feeds nothing but graph outputs (itself,
or through other such steps) to right after the last step it reads. The scheduler meets
it next to its producers and fuses it into their kernel; what it read dies with its last
other reader. A connected set of such steps moves only when it frees at least what it
makes early (`_memory_neutral`): a saved cast of a weight, read from a graph input, would
only be made earlier and stays. Run op by op the two orders hold the same bytes at the
graph's end (each saved value in place of what it read); the difference is the kernel
that computed all of them at once. Graphs of list ops keep list_order.py's order.
"""

from __future__ import annotations

import heapq

from fuselens.compiler import ir
from fuselens.compiler.ir import ComputeNode, GraphIR
from fuselens.compiler.list_order import element_wise_graph
from fuselens.compiler.runtime.plan_order import HOIST_SLACK
from fuselens.compiler.step_memory import step_bytes


def _movable(step: object) -> bool:
    """Pointwise work whose place in the graph changes nothing but memory: no reduction
    (its loop is the kernel's), no random draw (kept where random_ops.py put it)."""
    return (isinstance(step, ComputeNode) and not step.is_reduction
            and not any("rand" in op for op in step.aten_ops))


def outputs_early(graph: GraphIR, output_sources: set[str]) -> bool:
    """Reorder `graph.steps` as the module docstring says; True if any step moved."""
    steps = graph.steps
    if element_wise_graph(graph):
        return False
    producer, deps, users = ir.step_edges(steps)
    outs = {producer[n] for n in output_sources if n in producer}
    n = len(steps)
    feeds_outputs = [False] * n
    for j in reversed(range(n)):
        feeds_outputs[j] = (_movable(steps[j]) and bool(users[j] or j in outs)
                            and all(feeds_outputs[u] for u in users[j]))
    # one reading only graph inputs stays where it is: made earlier, it would only be alive longer
    known = set(producer) | {i.name for i in graph.inputs} | set(graph.constants)
    early = [e and bool(deps[j]) for j, e in enumerate(_memory_neutral(steps, graph, deps, users, outs, feeds_outputs,
                                                                      known))]
    if not any(early):
        return False
    waiting = [len(deps[j]) if early[j] else 0 for j in range(n)]
    ready: list[int] = []
    order: list[int] = []

    def place(j: int) -> None:
        order.append(j)
        for u in users[j]:
            if early[u]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, u)

    for j in range(n):
        if early[j]:
            continue  # placed once all it reads is
        place(j)
        while ready:
            place(heapq.heappop(ready))
    if order == list(range(n)):
        return False
    graph.steps[:] = [steps[j] for j in order]
    return True


def _memory_neutral(steps: list, graph: GraphIR, deps: list[set[int]], users: list[list[int]], outs: set[int],
                    feeds_outputs: list[bool], known: set[str]) -> list[bool]:
    """The steps to move: each connected set of steps feeding outputs whose move frees at
    least what it makes early. What it makes early is its graph outputs (alive to the end
    from then on); what it frees is each step it reads, not an output itself, that it was
    the last to read (the LayerNorm's input: it now dies at its last other reader).
    Like the plan's hoist, a set may make up to 1% more than it frees (`HOIST_SLACK`).
    An input mutation stored into its input makes nothing (`_overwrites_own_input`): a
    set that makes nothing moves even when it frees nothing, if it reads a step (to join
    that step's kernel); one reading graph inputs alone (a BatchNorm's count of batches)
    stays with the others like it at the end, in one kernel.
    A set whose steps would land right after a library call stays: nothing there takes it
    in, and the kernel it joined at the graph's end is one launch more (BERT training,
    H200: the casts of its matmuls' outputs, 390 -> 401 launches a step). So does one
    reading a buffer that no step makes and no input is: where it may go is not known."""
    n = len(steps)
    roots = _connected_sets(deps, feeds_outputs)
    readers_of = ir.buffer_readers(steps) if graph.input_mutations else {}
    made: dict[int, int] = {}
    freed: dict[int, int] = {}
    fed: set[int] = set()  # sets reading a step outside them
    unanchored: set[int] = set()
    for j in range(n):
        if not feeds_outputs[j]:
            continue
        r = roots[j]
        last = max(deps[j], default=None)
        if last is not None and not feeds_outputs[last] and not isinstance(steps[last], ComputeNode):
            unanchored.add(r)
        if not steps[j].reads <= known:
            unanchored.add(r)  # reads what no step or input names (a view the runtime makes): stays
        if any(not feeds_outputs[d] for d in deps[j]):
            fed.add(r)
        if j in outs and not _overwrites_own_input(j, steps, graph, deps, feeds_outputs, readers_of):
            made[r] = made.get(r, 0) + step_bytes(graph, steps[j])
        for d in deps[j]:
            if feeds_outputs[d] or d in outs:
                continue
            others = [u for u in users[d] if not feeds_outputs[u]]
            if others and max(others) < j and max(users[d]) == j:
                freed[r] = freed.get(r, 0) + step_bytes(graph, steps[d])

    def worth(r: int) -> bool:
        if not made.get(r, 0):  # moves to join the kernel of what it reads, if it reads a step
            return r in fed
        return freed.get(r, 0) > 0 and freed[r] >= HOIST_SLACK * made[r]

    return [feeds_outputs[j] and roots[j] not in unanchored and worth(roots[j]) for j in range(n)]


def _connected_sets(deps: list[set[int]], feeds_outputs: list[bool]) -> list[int]:
    """Each step's set of connected steps feeding outputs (a representative step's index)."""
    parent = list(range(len(deps)))

    def root(j: int) -> int:
        while parent[j] != j:
            parent[j] = parent[parent[j]]
            j = parent[j]
        return j

    for j, d_of_j in enumerate(deps):
        if feeds_outputs[j]:
            for d in d_of_j:
                if feeds_outputs[d]:
                    parent[root(d)] = root(j)
    return [root(j) for j in range(len(deps))]


def _overwrites_own_input(j: int, steps: list, graph: GraphIR, deps: list[set[int]], feeds_outputs: list[bool],
                          readers_of: dict[str, list[int]]) -> bool:
    """Whether output step `j` is an input mutation whose input only its own moving
    ancestors read: its new value is then stored into the input (plan.py
    `_mutate_inputs`), made early it holds no fresh bytes. A training BatchNorm's new
    running mean (`copy_` of `0.9 * old + 0.1 * mean`) read no buffer that died with it,
    stayed at the graph's end, and its value was one more per-channel buffer kept to the
    end and a kernel there (DenseNet-121: 120 layers)."""
    dst = graph.input_mutations.get(steps[j].name)
    if dst is None:
        return False
    readers = set(readers_of.get(dst, ()))
    seen, todo = {j}, [j]
    while todo and readers - seen:  # the moving ancestors of j
        for d in deps[todo.pop()]:
            if d not in seen and feeds_outputs[d]:
                seen.add(d)
                todo.append(d)
    return readers <= seen

