"""The runtime plan moves a kernel that frees at least what it allocates up to right
after the steps it reads (runtime/plan.py `_hoist_memory_neutral_kernels`): BERT's
backward padded the logits weight's saved cast after the logits gradient, and both
copies of the weight were alive at the step's peak. Plans built by hand over a
GraphIR of named buffers: the rule reads only the plan's steps and buffer sizes."""

from __future__ import annotations

import sympy
import torch

from fuselens.compiler.ir import BufferSpec, GraphIR
from fuselens.compiler.runtime.interpreter import ExternCall, KernelCall
from fuselens.compiler.runtime.plan import Planner

MB = 1 << 18  # float32 elements in a MiB


def _planner(inputs: list[str], sizes: dict[str, int], plan: list) -> Planner:
    specs = {n: BufferSpec(n, [sympy.Integer(e)], [sympy.Integer(1)], torch.float32) for n, e in sizes.items()}
    p = Planner.__new__(Planner)
    p.g = GraphIR(inputs=[specs[n] for n in inputs], buffers=specs)
    p.plan, p.alias_parent = plan, {}
    return p


def _mm(out: str, *ins: str) -> ExternCall:
    return ExternCall(out, torch.ops.aten.mm.default, tuple(("buf", b) for b in ins), {}, out)


def _kernel(out: str, *ins: str) -> KernelCall:
    return KernelCall(f"k_{out}", None, [*ins, out], [out], [], [])


def _order(p: Planner) -> list[str]:
    return [s.name for s in p.plan]


def test_a_kernel_freeing_what_it_allocates_runs_right_after_what_it_reads() -> None:
    # saved (a backward's saved activation) dies in k_pad, which allocates as much: it runs first
    p = _planner(["saved", "tangents_1", "primals_1"], {"saved": 4 * MB, "tangents_1": 8 * MB, "primals_1": 8 * MB,
                                                         "grad": 8 * MB, "gpad": 8 * MB, "pad": 4 * MB, "out": 8 * MB},
                 [_mm("grad", "tangents_1", "primals_1"), _kernel("gpad", "grad"), _kernel("pad", "saved"),
                  _mm("out", "gpad", "pad")])
    p._hoist_memory_neutral_kernels({"out"})
    assert _order(p) == ["k_pad", "grad", "k_gpad", "out"]


def test_no_move_where_an_input_is_read_later_or_is_held_by_the_caller() -> None:
    sizes = {"x": 4 * MB, "t": 4 * MB, "u": 4 * MB, "w": 4 * MB, "v": 4 * MB, "z": 4 * MB}
    # t is read again after k_w: k_w frees nothing by running earlier
    p = _planner(["x"], sizes, [_mm("t", "x"), _mm("z", "x"), _kernel("w", "t"), _mm("v", "t", "w")])
    p._hoist_memory_neutral_kernels({"v", "z"})
    assert _order(p) == ["t", "z", "k_w", "v"]
    # an inference graph's input stays alive with the caller: reading it last frees nothing
    p = _planner(["x"], sizes, [_mm("z", "x", "x"), _kernel("w", "x"), _mm("v", "z", "w")])
    p._hoist_memory_neutral_kernels({"v"})
    assert _order(p) == ["z", "k_w", "v"]
    # an intermediate that dies there does move up
    p = _planner(["x"], sizes, [_mm("t", "x"), _mm("z", "x"), _kernel("w", "t"), _mm("v", "z", "w")])
    p._hoist_memory_neutral_kernels({"v"})
    assert _order(p) == ["t", "k_w", "z", "v"]
