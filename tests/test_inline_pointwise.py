"""Cheap pointwise producers read in another iteration space are recomputed in
their readers (compiler/inline_pointwise.py): fewer kernels, same results."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import sympy
import torch

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from fuselens.compiler import inline_pointwise
from fuselens import sink
from fuselens.events import FusionDecision, Kernel


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_events(fn: Callable, *args: Any) -> tuple[Any, list]:
    seen: list = []
    sink.add_listener(seen.append)
    try:
        out = torch.compile(fn, backend="fuselens")(*args)
    finally:
        sink.remove_listener(seen.append)
    return out, seen


def generated(events: list) -> list[Kernel]:
    return [k for k in events if isinstance(k, Kernel) and k.kind == "cpp"]


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def test_rotary_embedding_negation_runs_inside_the_cat_kernel():
    x, cos, sin = torch.randn(2, 4, 16, 32), torch.randn(16, 32), torch.randn(16, 32)
    out, events = compiled_events(rotary, x, cos, sin)
    torch.testing.assert_close(out, rotary(x, cos, sin))
    (kernel,) = generated(events)
    assert "neg" in kernel.name
    (inline,) = [d for d in events if isinstance(d, FusionDecision) and d.rule == "inline"]
    assert inline.nodes[0] == "neg" and inline.kernel == kernel.name and "recomputed inside" in inline.reason


def test_scalar_producer_broadcast_into_a_larger_reader_is_not_a_kernel():
    def fn(x):
        limit = torch.full((), 0.5, dtype=x.dtype) * 2
        return torch.where(x > 0, x, limit)

    x = torch.randn(64, 64)
    out, events = compiled_events(fn, x)
    torch.testing.assert_close(out, fn(x))
    assert len(generated(events)) == 1


def test_residual_stream_with_several_readers_is_stored_not_recomputed_per_layer():
    def layers(x, a, b, c):
        h1 = x + a
        n1 = h1 / h1.square().mean(-1, keepdim=True)
        h2 = h1 + b * n1
        n2 = h2 / h2.square().mean(-1, keepdim=True)
        return h2 + c * n2

    args = [torch.randn(8, 64) for _ in range(4)]
    out, events = compiled_events(layers, *args)
    torch.testing.assert_close(out, layers(*args))
    homes = [k.name for k in generated(events) if "add" in k.name]
    inlined = [d.nodes[0] for d in events if isinstance(d, FusionDecision) and d.rule == "inline"]
    assert "add" not in inlined and "add_1" not in inlined, inlined
    assert homes, "the residual adds are stored by a kernel"


def test_centered_input_read_by_a_split_reduction_and_a_pointwise_kernel_is_recomputed_in_both():
    # BatchNorm's backward after split_reductions: x - mean feeds partial sums (in a view with
    # the height split) and the pointwise gradient; mean is one value a channel, no traffic
    def bn_backward_like(x, mean, g):
        d = x - mean
        partial = (g * d).view(4, 8, 2, 8, 16).sum((3, 4))
        return g - d * partial.sum((0, 2)).view(1, 8, 1, 1), partial

    gen = torch.Generator().manual_seed(0)
    x, g = torch.randn(4, 8, 16, 16, generator=gen), torch.randn(4, 8, 16, 16, generator=gen)
    mean = x.mean((0, 2, 3), keepdim=True)
    out, events = compiled_events(bn_backward_like, x, mean, g)
    for got, want in zip(out, bn_backward_like(x, mean, g)):  # sums of 256 products, in another order
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    inlined = [d.nodes[0] for d in events if isinstance(d, FusionDecision) and d.rule == "inline"]
    assert "sub" in inlined, inlined


def test_rotary_cos_and_sin_are_computed_once_per_position_not_per_head_on_the_cpu():
    # Llama's rotary embedding: cos/sin of [positions, dim] broadcast over batch and heads; in C++
    # each is a libm-like polynomial, recomputed 8x here (0.25-0.5 ms a layer at 2x128 tokens)
    def rope(q, k, freqs):
        cos, sin = freqs.cos(), freqs.sin()
        return rotary(q, cos, sin), rotary(k, cos, sin)

    q, k, freqs = torch.randn(2, 4, 16, 32), torch.randn(2, 2, 16, 32), torch.randn(16, 32)
    out, events = compiled_events(rope, q, k, freqs)
    for got, want in zip(out, rope(q, k, freqs)):
        torch.testing.assert_close(got, want)
    inlined = [d.nodes[0] for d in events if isinstance(d, FusionDecision) and d.rule == "inline"]
    assert "cos" not in inlined and "sin" not in inlined, inlined
    assert any("cos" in k.name for k in generated(events) if "cat" not in k.name)  # a kernel of its own


def test_bfloat16_producer_recomputed_in_a_reader_rounds_as_the_stored_value_did(monkeypatch):
    def fn(x, w):
        y = x * 3.3 + 0.1  # bf16 results, rounded when stored: recomputed, they must round the same
        return y[:, None, :] + w

    x = torch.randn(16, 32).bfloat16()
    w = torch.randn(16, 8, 32).bfloat16()
    out, events = compiled_events(fn, x, w)
    assert any(isinstance(d, FusionDecision) and d.rule == "inline" for d in events)
    torch._dynamo.reset()
    monkeypatch.setattr(inline_pointwise, "inline_pointwise", lambda graph, outputs, **kw: [])
    monkeypatch.setattr(inline_pointwise, "recompute_narrow_stores", lambda graph, groups, outputs, **kw: [])
    stored, events = compiled_events(fn, x, w)
    assert not any(isinstance(d, FusionDecision) and d.rule == "inline" for d in events)
    assert torch.equal(out, stored)
    torch.testing.assert_close(out, fn(x, w), rtol=1.6e-2, atol=1e-2)


def test_rotary_gradients_through_inlined_producers_equal_eager():
    x = torch.randn(2, 4, 16, 32, requires_grad=True)
    cos, sin = torch.randn(16, 32), torch.randn(16, 32)
    g = torch.randn(2, 4, 16, 32)
    rotary(x, cos, sin).backward(g)
    expected = x.grad.clone()
    x.grad = None
    torch.compile(rotary, backend="fuselens")(x, cos, sin).backward(g)
    torch.testing.assert_close(x.grad, expected)


def test_a_float_copy_of_narrower_inputs_is_recomputed_in_another_kernel_not_stored():
    """BatchNorm's backward shape: `x - mean` (float32, from a bfloat16 x) feeds the channel
    sums and, across a library call on those sums, a pointwise kernel. Stored, it is 4 bytes an
    element written and read back; the second kernel reads x's 2 bytes instead."""
    def fn(x16, mean, w):
        sub = x16.float() - mean
        m = sub.sum(0, keepdim=True) @ w  # the matmul needs the sums: the reader is another kernel
        return sub * m

    x16, mean, w = torch.randn(64, 32).bfloat16(), torch.randn(32), torch.randn(32, 32)
    out, events = compiled_events(fn, x16, mean, w)
    torch.testing.assert_close(out, fn(x16, mean, w), rtol=1e-4, atol=1e-3)  # sums of 64 in another order
    kernels = generated(events)
    assert len(kernels) == 2
    assert not [k for k in kernels if "sum" in k.name and "out_sub" in k.source.split(")")[0]], \
        [k.source.split(")")[0] for k in kernels]
    (d,) = [d for d in events if isinstance(d, FusionDecision) and d.rule == "inline"]
    assert d.nodes[0] == "sub" and "narrower" in d.reason


def test_a_select_backward_read_by_a_clone_and_its_sum_is_computed_in_their_kernel():
    # nn.MultiheadAttention's packed q, k, v gradient: each selected into zeros and added, then
    # laid out for the weight gradient (a clone) and summed for the bias gradient, both reading it
    # transposed; the sum, inlining the clone, is a second reader in a space as large
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    ref = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(3, 5, 32)
    seen: list = []
    sink.add_listener(seen.append)
    try:
        c = torch.compile(m, backend="fuselens", options={"fallback_on_error": False})
        c(x, x, x, need_weights=False)[0].square().sum().backward()
    finally:
        sink.remove_listener(seen.append)
    ref(x, x, x, need_weights=False)[0].square().sum().backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    backward = [k for k in generated(seen) if "backward" in k.graph_id]
    home = [k for k in backward if "aten.where.self" in k.ops]
    assert len(home) == 1 and "aten.clone.default" in home[0].ops and "aten.sum.dim_IntList" in home[0].ops, \
        [k.ops for k in backward]


def shifted_windows(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """Swin's window partition: layer norm, cyclic shift, windows of 7x7 tokens."""
    b, h, w, c = x.shape
    x = torch.roll(norm(x), shifts=(-3, -3), dims=(1, 2))
    x = x.view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b * (h // 7) * (w // 7), 49, c) * 2


def test_a_roll_of_a_layer_norm_is_read_by_the_window_copy_not_stored_twice():
    # the rolls move the normalized values only: the window copy loads them where they
    # come from, instead of two roll kernels each storing the whole tensor
    norm = torch.nn.LayerNorm(32)
    x = torch.randn(2, 28, 28, 32)
    with torch.no_grad():
        out, events = compiled_events(shifted_windows, x, norm)
        torch.testing.assert_close(out, shifted_windows(x, norm))
    kernels = generated(events)
    assert len(kernels) == 2, [k.name for k in kernels]
    assert any("index_select" in k.name and "clone" in k.name for k in kernels)


def test_arithmetic_after_a_row_statistic_is_not_moved_out_of_its_kernel():
    # a layer norm's output read transposed: computing it there would read x, the mean
    # and the variance again; only value-moving producers leave the statistic's kernel
    norm = torch.nn.LayerNorm(32)

    def fn(x):
        return norm(x).transpose(1, 2).contiguous() * 2

    x = torch.randn(4, 40, 32)
    with torch.no_grad():
        out, events = compiled_events(fn, x)
        torch.testing.assert_close(out, fn(x))
    moved = [d for d in events if isinstance(d, FusionDecision) and d.rule == "inline"
             and any(n.startswith(("add", "mul", "sub")) for n in d.nodes[:1])]
    assert not moved, [d.reason for d in moved]


def test_shifted_window_gradients_through_the_moved_rolls_equal_eager():
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(32)
    x = torch.randn(2, 14, 14, 32, requires_grad=True)
    g = torch.randn(8, 49, 32)
    out, _ = compiled_events(shifted_windows, x, norm)
    grads = torch.autograd.grad(out, [x, norm.weight, norm.bias], g)
    expected = torch.autograd.grad(shifted_windows(x, norm), [x, norm.weight, norm.bias], g)
    for got, want in zip(grads, expected):  # the weight gradients sum 392 rows in another order
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_producer_recomputed_in_its_only_reader_leaves_no_kernel_behind(monkeypatch):
    """A float copy of a bfloat16 input, read far later (the fusion is refused as too far
    apart: the window shrunk here, 540 ops in BERT's training backward on the GPU), is
    recomputed in its reader; its own kernel then had nothing to store and still ran."""
    from fuselens.compiler import scheduler

    monkeypatch.setattr(scheduler.Scheduler, "PEAK_WINDOW", 2)

    def fn(x16, a, w):
        y = x16.float()
        for _ in range(3):
            a = a @ w
        return y + a

    x16, a, w = torch.randn(16, 16).bfloat16(), torch.randn(16, 16), torch.randn(16, 16)
    out, events = compiled_events(fn, x16, a, w)
    torch.testing.assert_close(out, fn(x16, a, w))
    assert any(d.rule == "inline" and "narrower" in d.reason for d in events if isinstance(d, FusionDecision))
    kernels = generated(events)
    stores_nothing = [k.name for k in kernels if "* __restrict__" not in k.source.replace("const ", "@")]
    assert kernels and not stores_nothing, stores_nothing


def test_a_product_read_by_a_column_sum_is_recomputed_there_when_its_inputs_are_as_wide():
    """ViT's last LayerNorm backward: the gradient times the saved normalized input (float32)
    feeds the row sums of the input gradient and the column sum of the weight gradient, two
    kernels. Stored, it was a buffer as large as the saved input, written, read once, and
    alive at the backward's peak; the column sum loads the saved input instead (4 bytes for 4)."""
    def fn(xhat, g, w):
        p = xhat * g  # g broadcasts: a per-column gradient, small next to p
        return ((p * w).sum(-1, keepdim=True) * xhat).sum(-1), p.sum(0)

    xhat, g, w = torch.randn(64, 32), torch.randn(32), torch.randn(32)
    out, events = compiled_events(fn, xhat, g, w)
    for got, want in zip(out, fn(xhat, g, w)):
        torch.testing.assert_close(got, want)
    kernels = generated(events)
    assert len(kernels) == 2
    assert not [k for k in kernels if "out_mul " in k.source.split(")")[0] + " "], \
        [k.source.split(")")[0] for k in kernels]
    (d,) = [d for d in events if isinstance(d, FusionDecision) and d.rule == "inline"]
    assert d.nodes[0] == "mul" and "no wider" in d.reason


def test_a_constant_in_a_body_costs_no_operation():
    from fuselens.compiler.inline_pointwise import _counted
    from fuselens.compiler.ir import ComputeNode

    node = ComputeNode("n", [sympy.Integer(4)], [sympy.Integer(1)], torch.float32,
                       lambda ops, idx: ops.add(ops.mul(ops.load("x", idx[0]), ops.constant(2.0, torch.float32)),
                                                ops.constant(1.0, torch.float32)), ["n"], ["aten.add.Tensor"])
    assert _counted(node).count == 3  # the load, the multiply, the add


def test_a_layer_norm_output_read_at_one_token_is_computed_there_not_stored_whole():
    """ViT's head reads its last LayerNorm's output at the class token, one of 197: the
    normalized values were written for all of them (an 18 MB float32 buffer at the
    training step's peak, the forward's end); the token's reader now computes them."""
    def fn(x, w, b):
        y = torch.nn.functional.layer_norm(x, (32,), w, b)
        return y[:, 0] * 2

    x, w, b = torch.randn(4, 50, 32), torch.randn(32), torch.randn(32)
    out, events = compiled_events(fn, x, w, b)
    torch.testing.assert_close(out, fn(x, w, b))
    inlined = [d for d in events if isinstance(d, FusionDecision) and d.rule == "inline"]
    assert inlined, [(d.rule, d.nodes) for d in events if isinstance(d, FusionDecision)]
    params = [k.source.split(")")[0].split("(", 1)[1].split(", ") for k in generated(events)]
    written = [p for ps in params for p in ps if "b_add_1" in p and not p.startswith("const ")]
    assert not written, params  # the normalized output, 4x50x32


def test_a_residual_sum_read_at_one_token_is_recomputed_there_not_stored_whole():
    """ViT's forward ends with the last residual sum, normalized in a row kernel, and the
    head's reader of the class token: with the LayerNorm's output computed there, the sum
    (float32, 4 + 2 bytes to read an element) was stored whole for it. The reader computes
    one token of 50, which costs less than writing all of them."""
    def fn(x, h, w, b):
        s = x + h.float()
        y = torch.nn.functional.layer_norm(s, (32,), w, b)
        return y[:, 0] * 2

    x, h = torch.randn(4, 50, 32), torch.randn(4, 50, 32).bfloat16()
    w, b = torch.randn(32), torch.randn(32)
    out, events = compiled_events(fn, x, h, w, b)
    torch.testing.assert_close(out, fn(x, h, w, b), rtol=1e-4, atol=1e-4)
    params = [k.source.split(")")[0].split("(", 1)[1].split(", ") for k in generated(events)]
    written = [p for ps in params for p in ps if not p.startswith("const ")]
    assert not [p for p in written if p.endswith(" b_add")], params  # the residual sum, 4x50x32
    assert any(d.rule == "inline" and "part of its elements" in d.reason for d in events
               if isinstance(d, FusionDecision))


def _combined_experts(k: int) -> tuple[Any, list]:
    """64 rows of expert outputs scaled by their routing weights, gathered back into the
    order of 64 / k tokens by the inverse of the routing permutation and summed over each
    token's k experts, compiled: (output, events), the output checked against eager."""
    def combine(proj, w, perm, resid):
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        t, h = resid.shape
        return resid + (proj * w[:, None])[inv].view(t, k, h).sum(1)

    args = (torch.randn(64, 32), torch.rand(64), torch.randperm(64), torch.randn(64 // k, 32))
    out, events = compiled_events(combine, *args)
    torch.testing.assert_close(out, combine(*args))
    return out, events


def test_a_gather_read_twice_in_another_space_is_recomputed_there():
    """Mixtral's expert rows gathered back into token order are read twice by the sum
    over each token's two experts: the gather only moves values, so its last load
    replaces the sum's load of it, and the sum gathers the rows itself (Inductor's
    kernel too), where the rows were written once and read back."""
    out, events = _combined_experts(2)
    assert any(isinstance(e, FusionDecision) and e.rule == "inline" and e.nodes[0] == "index" and "sum_1" in e.nodes
               for e in events), [e for e in events if isinstance(e, FusionDecision)]
    assert not any("index" in k.ops[0] and len(k.ops) == 1 for k in generated(events))


def test_a_producer_too_costly_to_recompute_in_another_space_says_why_in_the_refusal():
    """The same gather read by a sum over four experts a token: recomputed there, its
    index arithmetic would be more operations an element than MAX_OPS, so it stays a
    kernel of its own and the scheduler's refusal says why."""
    out, events = _combined_experts(4)
    (refusal,) = [e for e in events if isinstance(e, FusionDecision) and e.decision == "not_fused"
                  and e.rule == "iteration-space" and e.nodes == ["index", "sum_1"]]
    assert refusal.reason.endswith("; index is not recomputed inside sum_1 instead: its 7 ops (6 besides the load it "
                                   "replaces), loaded 4 times by a reader, would be 24 operations an element there (at most 12)"), refusal.reason


def test_a_key_cached_by_a_cat_onto_an_empty_tensor_is_stored_by_the_kernel_computing_it():
    """An HF cache's first update is `cat([empty, k], -2)` of the rotated key, which the
    model returns: the cat reads the key where it stores it, so the rotary kernel stores
    the cache too (Mixtral, Llama and Qwen2 inference: a kernel a layer fewer)."""
    def keys(x, cos, sin):
        k = rotary(x.transpose(1, 2), cos, sin)  # [b, h, s, d] over [b, s, h, d] memory
        cache = torch.cat([torch.tensor([]), k], dim=-2)
        return cache, cache.sum(-1)

    x, cos, sin = torch.randn(2, 16, 4, 32), torch.randn(16, 32), torch.randn(16, 32)
    out, events = compiled_events(keys, x, cos, sin)
    for got, want in zip(out, keys(x, cos, sin)):
        torch.testing.assert_close(got, want)
    (kernel,) = generated(events)  # rotate, store the cache, sum it: one loop
    assert kernel.ops.count("aten.cat.default") == 2, kernel.ops  # the rotation's cat and the cache's


def test_rows_scaled_by_normalized_routing_weights_are_scaled_in_the_sum_that_reads_them():
    """Mixtral scales each expert's output rows by the token's routing weight, normalized
    by the sum over its two experts (a reduction) and gathered into the experts' order:
    through the gather it is no longer the sum's epilogue (no row kernel computes it), so
    the scaling is computed in the sum over each token's experts that reads it rather
    than stored and loaded (Inductor's kernel too)."""
    def combine(proj, logits, perm, resid):
        w = logits.topk(2, dim=-1).values
        w = (w / w.sum(-1, keepdim=True)).reshape(-1)[perm]
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        t, h = resid.shape
        return resid + (proj * w[:, None])[inv].view(t, 2, h).sum(1)

    args = (torch.randn(64, 32), torch.randn(32, 8), torch.randperm(64), torch.randn(32, 32))
    out, events = compiled_events(combine, *args)
    torch.testing.assert_close(out, combine(*args))
    assert not [k.ops for k in generated(events) if "aten.mul.Tensor" in k.ops and "aten.sum.dim_IntList" not in k.ops
                and "aten.add.Tensor" not in k.ops], [k.ops for k in generated(events)]


def test_a_trivial_scale_of_a_reduction_the_graph_returns_is_recomputed_by_its_reader():
    """BatchNorm's backward scales the bias gradient (a column sum the graph returns) by
    1/N for the input gradient: its reader loads the sum it would load anyway and
    multiplies, instead of a kernel storing a second per-channel buffer. A scale of a
    sum the graph does not return stays in the sum's kernel (the reader would need the
    sum stored for it), as an epilogue of a row statistic does."""
    def returned(x):
        s = x.sum(0)
        return s, x - s * (1 / 64)

    def not_returned(x):
        s = x.sum(0)
        return x - s * (1 / 64)

    x = torch.randn(64, 48)
    for fn, inlined in ((returned, True), (not_returned, False)):
        torch._dynamo.reset()
        out, events = compiled_events(fn, x)
        torch.testing.assert_close(out, fn(x))
        moved = [d for d in events if isinstance(d, FusionDecision) and d.rule == "inline" and d.nodes[0] == "mul"]
        assert bool(moved) == inlined, (fn.__name__, [d.reason for d in events if isinstance(d, FusionDecision)])
