"""The runtime plan moves a step that frees at least what it allocates up to right
after the steps it reads, and a step whose outputs wait for a late reader down to
just before it, when the graph's peak does not rise (runtime/plan_order.py): BERT's
backward padded the logits weight's saved cast after the logits gradient, and both
copies of the weight were alive at the step's peak. Plans built by hand over a
GraphIR of named buffers: the rules read only the plan's steps and buffer sizes."""

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
    p.plan, p.alias_parent, p.views = plan, {}, set()
    return p


def _mm(out: str, *ins: str) -> ExternCall:
    return ExternCall(out, torch.ops.aten.mm.default, tuple(("buf", b) for b in ins), {}, out)


def _kernel(out: str, *ins: str) -> KernelCall:
    return KernelCall(f"k_{out}", None, [*ins, out], [out], [], [])


def _hoist(p: Planner, outputs: set[str]) -> None:
    p._memory_order(outputs).hoist()


def _sink(p: Planner, outputs: set[str]) -> None:
    p._memory_order(outputs).sink()


def _order(p: Planner) -> list[str]:
    return [s.name for s in p.plan]


def test_a_kernel_freeing_what_it_allocates_runs_right_after_what_it_reads() -> None:
    # saved (a backward's saved activation) dies in k_pad, which allocates as much: it runs first
    p = _planner(["saved", "tangents_1", "primals_1"], {"saved": 4 * MB, "tangents_1": 8 * MB, "primals_1": 8 * MB,
                                                         "grad": 8 * MB, "gpad": 8 * MB, "pad": 4 * MB, "out": 8 * MB},
                 [_mm("grad", "tangents_1", "primals_1"), _kernel("gpad", "grad"), _kernel("pad", "saved"),
                  _mm("out", "gpad", "pad")])
    _hoist(p, {"out"})
    assert _order(p) == ["k_pad", "grad", "k_gpad", "out"]


def test_no_move_where_an_input_is_read_later_or_is_held_by_the_caller() -> None:
    sizes = {"x": 4 * MB, "t": 4 * MB, "u": 4 * MB, "w": 4 * MB, "v": 4 * MB, "z": 4 * MB}
    # t is read again after k_w: k_w frees nothing by running earlier
    p = _planner(["x"], sizes, [_mm("t", "x"), _mm("z", "x"), _kernel("w", "t"), _mm("v", "t", "w")])
    _hoist(p, {"v", "z"})
    assert _order(p) == ["t", "z", "k_w", "v"]
    # an inference graph's input stays alive with the caller: reading it last frees nothing
    p = _planner(["x"], sizes, [_mm("z", "x", "x"), _kernel("w", "x"), _mm("v", "z", "w")])
    _hoist(p, {"v"})
    assert _order(p) == ["z", "k_w", "v"]
    # an intermediate that dies there does move up
    p = _planner(["x"], sizes, [_mm("t", "x"), _mm("z", "x"), _kernel("w", "t"), _mm("v", "z", "w")])
    _hoist(p, {"v"})
    assert _order(p) == ["t", "k_w", "z", "v"]


def _view(out: str, base: str) -> ExternCall:
    return ExternCall(out, torch.ops.aten.permute.default, (("buf", base), [1, 0]), {}, out)


def test_a_matmul_that_frees_a_saved_activation_runs_before_one_that_allocates_with_its_views() -> None:
    # ViT's backward: fc2's input gradient (big) was computed while the GELU output, read
    # only by fc2's weight gradient after it, was alive; the weight gradient and the view
    # it reads move up, the view's base having been made before
    sizes = {"tangents_1": 4 * MB, "gelu_out": 16 * MB, "primals_1": 1 * MB, "g": 4 * MB, "gt": 4 * MB,
             "grad_in": 16 * MB, "wgrad": 1 * MB, "k_out": 16 * MB}
    p = _planner(["tangents_1", "gelu_out", "primals_1"], sizes, [
        _kernel("g", "tangents_1"), _mm("grad_in", "g", "primals_1"), _kernel("k_out", "grad_in"),
        _view("gt", "g"), _mm("wgrad", "gt", "gelu_out")])
    p.views = {"gt"}
    p.alias_parent = {"gt": "g"}
    _hoist(p, {"k_out", "wgrad"})
    assert _order(p) == ["k_g", "gt", "wgrad", "grad_in", "k_k_out"]


def test_a_library_call_with_state_keeps_its_place() -> None:
    # a random draw moved earlier would draw other numbers: only pure library calls move
    sizes = {"tangents_1": 4 * MB, "saved": 16 * MB, "g": 16 * MB, "big": 16 * MB, "drop": 1 * MB}
    drop = ExternCall("drop", torch.ops.aten.native_dropout.default, (("buf", "saved"), 0.1, True), {}, "drop")
    p = _planner(["tangents_1", "saved"], sizes, [_kernel("g", "tangents_1"), _mm("big", "g", "g"), drop])
    _hoist(p, {"big", "drop"})
    assert _order(p) == ["k_g", "big", "drop"]


def test_a_gradient_nothing_reads_is_made_at_the_graphs_end_with_its_matmul() -> None:
    # ResNet-50's backward made the classifier's float32 weight gradient first and held it
    # through the last block's convolution gradients; its matmul reads two small inputs
    sizes = {"tangents_1": MB // 4, "pooled": MB // 4, "saved": 16 * MB, "wg16": 4 * MB, "wg": 8 * MB,
             "g": 16 * MB, "gin": 16 * MB}
    p = _planner(["tangents_1", "pooled", "saved"], sizes, [
        _mm("wg16", "tangents_1", "pooled"), _kernel("wg", "wg16"), _mm("g", "tangents_1", "saved"),
        _kernel("gin", "g", "saved")])
    _sink(p, {"wg", "gin"})
    assert _order(p) == ["g", "k_gin", "wg16", "k_wg"]


def test_a_backwards_incoming_gradient_counts_alive_until_the_graph_returns() -> None:
    # GPT-2's backward: autograd's engine holds the logits gradient (tangents_1) through
    # the call, so padding it frees nothing. Counted freed, the saved weight cast's padded
    # copy (a little larger than the cast) could not move to the start: the peak at the
    # gradient's padding would rise by the padding. It now runs first and frees the cast
    # before the weight gradient is made (GPT-2 training on the H100: step peak 3001.6 -> 2866.3 MB).
    sizes = {"tangents_1": 16 * MB, "w16": 4 * MB, "hidden": MB, "gpad": 16 * MB + 1024,
             "wgrad": 4 * MB + 1024, "wpad": 4 * MB + 1024, "gin": MB}
    plan = [_kernel("gpad", "tangents_1"), _mm("wgrad", "gpad", "hidden"), _kernel("wpad", "w16"),
            _mm("gin", "gpad", "wpad")]
    p = _planner(["tangents_1", "w16", "hidden"], sizes, plan)
    assert "tangents_1" not in p._memory_order({"wgrad", "gin"}).freeable
    _hoist(p, {"wgrad", "gin"})
    assert _order(p)[0] == "k_wpad"
    assert _order(p).index("gin") < _order(p).index("wgrad")  # the padded copy dies before wgrad is made


def test_no_move_that_would_raise_the_graphs_peak() -> None:
    # ResNet-50's backward: the input image copied to channels-last for the first
    # convolution's gradient, at the end, frees as much as it allocates; hoisted to the
    # backward's start, where every saved activation is alive, it made the step's peak
    sizes = {"tangents_1": MB, "saved": 16 * MB, "img": 4 * MB, "a": MB, "clone": 4 * MB, "out": MB}
    plan = [_kernel("a", "tangents_1", "saved"), _kernel("clone", "img"), _mm("out", "a", "clone")]
    p = _planner(["tangents_1", "saved", "img"], sizes, plan)
    order = p._memory_order({"out"})
    assert order._hoist_target(1) == (0, [])  # it would free what it allocates there
    order.hoist()
    assert _order(p) == ["k_a", "k_clone", "out"]


def test_the_index_kept_across_moves_equals_one_built_afresh() -> None:
    # each accepted move re-indexes only the steps it passed: the result must be the full index's
    sizes = {"tangents_1": MB // 4, "pooled": MB // 4, "saved": 16 * MB, "img": 4 * MB, "wg16": 4 * MB,
             "wg": 8 * MB, "g": 16 * MB, "gin": 16 * MB, "clone": 4 * MB, "out": 2 * MB}
    p = _planner(["tangents_1", "pooled", "saved", "img"], sizes, [
        _kernel("clone", "img"), _mm("wg16", "tangents_1", "pooled"), _kernel("wg", "wg16"),
        _mm("g", "tangents_1", "saved"), _kernel("gin", "g", "saved"), _mm("out", "gin", "clone")])
    order = p._memory_order({"wg", "out"})
    order.hoist()
    order.sink()
    assert _order(p) != ["k_clone", "wg16", "k_wg", "g", "k_gin", "out"]  # something moved
    kept = (order.before, order.during, order.touches, order.producer, order.peak)
    fresh = p._memory_order({"wg", "out"})
    assert kept == (fresh.before, fresh.during, fresh.touches, fresh.producer, fresh.peak)


def test_a_step_freeing_a_saved_activation_runs_right_after_its_other_reader_and_before_a_larger_one() -> None:
    # ViT's last LayerNorm: its column sums (tiny partials) free the saved normalized input
    # the row kernel also reads; a weight gradient's matmul (4 MB, freeing a wider saved
    # activation) was hoisted ahead of them, and the saved input stayed alive under it
    sizes = {"tangents_1": 4 * MB, "saved": 16 * MB, "wide": 32 * MB, "row": 8 * MB, "big": 16 * MB,
             "wg": 4 * MB, "col": 256}
    p = _planner(["tangents_1", "saved", "wide"], sizes, [
        _kernel("row", "tangents_1", "saved"), _mm("big", "row", "row"), _kernel("col", "saved", "row"),
        _mm("wg", "row", "wide")])
    order = p._memory_order({"big", "col", "wg"})
    order.hoist()
    assert [s.name for s in order.plan] == ["k_row", "k_col", "wg", "big"]
    # the saved 48 MB, the row kernel's 8 and the sums' 1 KB; before, the matmul's 4 MB instead
    assert order.peak == 56 * MB * 4 + 256 * 4


def test_a_kernel_writing_over_its_input_allocates_nothing_and_moves_up_to_free_what_it_reads() -> None:
    # k_acc accumulates into gbig (its output acc shares gbig's memory) and is t's last
    # reader: running it before z frees t there. Counted as allocating acc's 8 MB, it would
    # have had to free that much to move
    p = _planner(["x"], {"x": 4 * MB, "t": 2 * MB, "gbig": 8 * MB, "acc": 8 * MB, "z": 4 * MB, "v": 4 * MB},
                 [_mm("t", "x"), _mm("gbig", "x"), _mm("z", "x"), KernelCall("k_acc", None, ["t", "gbig", "acc"],
                                                                             ["acc"], [], []), _mm("v", "z", "acc")])
    p.alias_parent = {"acc": "gbig"}
    _hoist(p, {"v"})
    assert _order(p) == ["t", "gbig", "k_acc", "z", "v"]
