"""A graph of list ops (`_foreach_*`: a compiled optimizer step) in element order.

Dynamo traces an optimizer step op by op over whole lists: `_foreach_lerp_` of every
`exp_avg`, then `_foreach_mul_` of every `exp_avg_sq`, ... Lowered element by element
(lowering/foreach.py), its steps come in that order, and the scheduler, greedy in step
order, joined each op's elements of one shape side by side (horizontal fusion) before it
met the next op: 64 nodes filled with a few ops of many parameters, each parameter's
chain cut at every kernel boundary and its intermediates written and read again. A
compiled AdamW step over GPT-2's parameters moved 1.9x the bytes it must (the C++
target's count; 1.68 ms of kernels on the H200 against Inductor's 0.59, which joins a
list op's elements in one kernel and fuses list ops element-wise).

`element_major` reorders such a graph so that each step is followed at once by the
steps that consume it in the same iteration space as soon as all they read is
computed (depth first), those it waits for first when they are scalars (an element's
bias correction): each parameter's chain is contiguous, and the scheduler fuses
it whole before a same-shaped next parameter joins side by side. `GraphIR.chains`
records how many steps each chain holds, so that the scheduler starts a parameter in a
kernel only where its whole chain fits (option `max_fusion_size`).

Only graphs with list elements, and graphs of pointwise work updating their inputs
(an optimizer step's for-loop implementation: `_updates_inputs_pointwise`), are
reordered: other graphs keep their order (and their kernels).
"""

from __future__ import annotations

from typing import Any, Optional

from fuselens.compiler import ir
from fuselens.compiler.ir import ComputeNode, GraphIR


def _follows(step: Any, after: Any) -> bool:
    """Whether `step` continues the chain of `after`: pointwise work in its space."""
    return (isinstance(step, ComputeNode) and isinstance(after, ComputeNode) and not step.is_reduction
            and not after.is_reduction and ir.same_sizes(ir.squeeze(step.size), ir.squeeze(after.size)))


def _scalar(step: Any) -> bool:
    return isinstance(step, ComputeNode) and not step.is_reduction and all(d == 1 for d in step.size)


def _updates_inputs_pointwise(graph: GraphIR) -> bool:
    """A graph of pointwise work only that updates its inputs: an optimizer step without
    list ops (torch's default on the CPU is its for-loop implementation, a parameter at a
    time), an EMA of weights. Its updates come at its end as copies into the inputs
    (AOTAutograd's functional form), after every parameter's chain: each was a kernel of its
    own, and each chain stored its new values to fresh buffers for them (page faults at
    every step). In element order each copy follows its value and joins its kernel."""
    return bool(graph.input_mutations) and all(
        isinstance(s, ComputeNode) and not s.is_reduction for s in graph.steps)


def element_wise_graph(graph: GraphIR) -> bool:
    """Whether `graph` is an optimizer step's kind: list ops, or pointwise work updating its
    inputs. `element_major` reorders these; combo_kernels.py joins their kernels' launches."""
    return any(isinstance(s, ComputeNode) and s.list_element for s in graph.steps) or _updates_inputs_pointwise(graph)


def element_major(graph: GraphIR) -> bool:
    """Reorder `graph.steps` as the module docstring says; True if any step moved."""
    steps = graph.steps
    if not element_wise_graph(graph):
        return False
    _, deps, users = ir.step_edges(steps)
    done = [False] * len(steps)
    order: list[int] = []

    def missing(u: int) -> Optional[list[int]]:
        """The producers u still waits for, if all may run now: scalars (an element's
        bias correction, from its step count) and pointwise work in u's space (the same
        element's other list ops: AdamW's parameter update waits for both moments,
        traced after the weight decay that starts its chain). None if another kind is
        among them."""
        out: set[int] = set()
        stack = [u]
        while stack:
            for d in deps[stack.pop()]:
                if not done[d] and d not in out:
                    step = steps[d]
                    if not (_scalar(step) or _follows(step, steps[u])):
                        return None
                    out.add(d)
                    stack.append(d)
        return sorted(out)  # in step order: each after its own producers

    def emit(i: int) -> None:
        head, length = steps[i], 0
        stack = [i]

        def place(j: int) -> None:
            nonlocal length
            done[j] = True
            order.append(j)
            length += _follows(steps[j], head) or j == i
            stack.extend(reversed([u for u in users[j] if not done[u] and _follows(steps[u], steps[j])]))

        while stack:  # depth first: the first consumer next
            j = stack.pop()
            if done[j]:
                continue
            before = missing(j)
            if before is None:
                continue  # the main loop or another chain places it
            for d in before:
                place(d)
            place(j)
        if length > 1:
            graph.chains[head.name] = length

    for i in range(len(steps)):
        if not done[i]:
            emit(i)  # every producer of i came before it: already emitted
    if order == list(range(len(steps))):
        return False
    graph.steps[:] = [steps[i] for i in order]
    return True
