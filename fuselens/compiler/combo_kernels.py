"""Independent kernels of an optimizer step joined in one launch (a combo kernel).

A compiled optimizer step is one list op after another over every parameter
(`_foreach_*`); list_order.py puts it in element order, and the scheduler fuses each
parameter's chain into one kernel, side by side with other parameters of its shape.
Parameters of other shapes stay kernels of their own: GPT-2's AdamW step was 32
launches, ResNet-50's 58 (its BatchNorm weights and biases: 64 to 2048 elements each),
against Inductor's 5 and 11, which joins a list op's elements of every shape in one
kernel. Without CUDA graphs the launches cost host time; under CUDA graphs they cost
GPU time, a few microseconds of ramp-up and tail each: reduce-overhead ran ResNet-50's
step in 1.61 ms against our 1.84.

`join_list_kernels` joins consecutive kernels of such a graph that the target can run
as parts of one kernel (`Target.combo_part`: for Triton, a 1-D pointwise kernel of
static sizes) and that are independent: no part reads or writes what another writes,
an input a part updates in place included. Each part keeps its own loop over its own
elements (a range of program ids: `codegen/triton_combo.py`); what it
saves is the launches. Only graphs of that kind are joined (list ops, or pointwise work
updating its inputs: an optimizer's for-loop implementation, `list_order.element_wise_graph`);
elsewhere the scheduler fuses what shares data, and joining unrelated kernels would only
change their block sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import sympy

from fuselens.compiler import ir
from fuselens.compiler.ir import GraphIR
from fuselens.compiler.list_order import element_wise_graph
from fuselens.compiler.kernel_group import KernelGroup, kernel_name
from fuselens.compiler.scheduler import Schedule

# At most this many parts in one kernel, and buffers among them: each part is one more
# branch for Triton to compile, and each buffer a kernel parameter (Inductor keeps its
# foreach kernels under 250 arguments). Larger combos compile much longer and run no faster
# (H200, AdamW, compile s under CUDA graphs without / with combos: 16 parts and 128 buffers,
# GPT-2 4.75 / 5.25; 32 and 250, ResNet-50 11.3 / 18.7, GPT-2 6.8 / 10.4, while GPT-2's
# kernels took 0.62 and 0.63 ms).
MAX_PARTS = 16
MAX_BUFFERS = 128


@dataclass
class ComboGroup(KernelGroup):
    """Kernels launched as one: `parts`, each with its own loop, in program order."""

    parts: list[KernelGroup] = field(default_factory=list)


def _buffers(group: KernelGroup, graph: GraphIR) -> tuple[set[str], set[str]]:
    """(what the kernel reads from memory, what it writes: its stores and the inputs they update)."""
    own = group.names()
    reads = {r for n in group.nodes for r in n.reads if r not in own}
    writes = set(group.stores) | {graph.input_mutations[s] for s in group.stores if s in graph.input_mutations}
    return reads, writes


def join_list_kernels(graph: GraphIR, sched: Schedule, is_part: Callable[[KernelGroup], bool],
                      prefix: str) -> list[ComboGroup]:
    """Join runs of consecutive independent kernels into ComboGroups, in `sched` itself
    (units, groups, group_of); returns the combos. Only an optimizer step's kind of graph
    (list_order.element_wise_graph)."""
    if not element_wise_graph(graph):
        return []
    units: list[Any] = []
    combos: list[ComboGroup] = []
    run: list[KernelGroup] = []
    reads: set[str] = set()
    writes: set[str] = set()

    def close() -> None:
        if len(run) > 1:
            combo = _combo(list(run), len(combos), prefix)
            combos.append(combo)
            units.append(combo)
        else:
            units.extend(run)
        run.clear()
        reads.clear()
        writes.clear()

    for u in sched.units:
        if not (isinstance(u, KernelGroup) and is_part(u)):
            close()
            units.append(u)
            continue
        r, w = _buffers(u, graph)
        if run and (r & writes or w & (reads | writes) or len(run) >= MAX_PARTS
                    or len(reads | writes | r | w) > MAX_BUFFERS):
            close()
        run.append(u)
        reads |= r
        writes |= w
    close()
    if combos:
        sched.units[:] = units
        sched.groups[:] = [u for u in units if isinstance(u, KernelGroup)]
        for c in combos:
            for n in c.nodes:
                sched.group_of[n.name] = c
    return combos


def _combo(parts: list[KernelGroup], counter: int, prefix: str) -> ComboGroup:
    total = sum((ir.numel(p.full) for p in parts), sympy.Integer(0))
    combo = ComboGroup(nodes=[n for p in parts for n in p.nodes], full=[total], order=parts[0].order,
                       stores=set().union(*(p.stores for p in parts)), parts=parts)
    combo.reasons = [f"{len(parts)} independent kernels of an optimizer step in one launch (a combo kernel: each "
                     "part keeps its own loop over its elements)"] + [r for p in parts for r in p.reasons]
    combo.name = kernel_name(combo, counter, f"{prefix}_combo")
    return combo
