"""Graph rewrites before lowering (compiler/graph_passes.py): each keeps every value
and every graph output's layout as eager has them.

The matmul padding and convolution-bias rules are for CUDA (index_add serves both targets); here
they run on CPU graphs (`require_cuda=False`), where the same FX rewrite is checked against eager.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from fuselens import sink
from fuselens.compiler.entry import decompositions
from fuselens.compiler.graph_passes import (cats_extend_earlier_cats, convolution_bias_as_add, gather_through_pointwise,
                                            index_put_accumulate_as_index_add, pad_unaligned_matmuls)
from fuselens.events import FusionDecision

aten = torch.ops.aten


def traced(fn, *args):
    return make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(*args)


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_cross_entropy_gathers_the_logits_not_the_full_log_softmax():
    logits, target = torch.randn(64, 1003).bfloat16(), torch.randint(0, 1003, (64,))
    target[3] = -100  # ignored rows keep working

    def loss(l, t):
        return F.cross_entropy(l.float(), t)

    gm = traced(loss, logits, target)
    done = gather_through_pointwise(gm)
    assert [r.rule for r in done] == ["gather-through-pointwise"]
    gathers = [n for n in gm.graph.nodes if n.target is aten.gather.default]
    # the gather now reads the bf16 logits (a placeholder), not a full-size float result
    assert len(gathers) == 1 and gathers[0].args[0].op == "placeholder"
    torch.testing.assert_close(gm(logits, target), loss(logits, target), rtol=1e-5, atol=1e-5)


def test_gather_stays_when_an_operand_varies_along_the_gathered_dim_in_another_shape():
    x, y, idx = torch.randn(8, 5), torch.randn(1, 5), torch.randint(0, 5, (8, 2))

    def fn(x, y, idx):
        return torch.gather(x * y, 1, idx)  # y varies along dim 1: cannot be kept as is

    gm = traced(fn, x, y, idx)
    assert gather_through_pointwise(gm) == []
    assert torch.equal(gm(x, y, idx), fn(x, y, idx))


def test_cross_entropy_training_through_the_backend_equals_eager():
    torch.manual_seed(0)
    w = torch.randn(1003, 64, requires_grad=True)
    h, target = torch.randn(32, 64, requires_grad=True), torch.randint(0, 1003, (32,))

    def step(h, w):
        return F.cross_entropy(h @ w.t(), target)

    with sink.collect() as events:
        out = torch.compile(step, backend="fuselens")(h, w)
        out.backward()
    got = (out.detach(), h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    ref = step(h, w)
    ref.backward()
    torch.testing.assert_close(got, (ref.detach(), h.grad, w.grad), rtol=1e-4, atol=1e-5)
    assert any(isinstance(e, FusionDecision) and e.rule == "gather-through-pointwise" for e in events)


@pytest.mark.parametrize("case", ["lm_head", "addmm_bias", "transposed_a"])
def test_unaligned_matmul_is_padded_keeping_values_and_eager_layouts_unless_padded_outputs_are_allowed(case):
    g = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    if case == "lm_head":  # vocab 1003: the output's leading dimension is unaligned
        args = (torch.randn(512, 768, generator=g).to(bf), torch.randn(1003, 768, generator=g).to(bf))
        fn = lambda h, w: (h @ w.t()).view(2, 256, 1003)  # noqa: E731
    elif case == "addmm_bias":
        args = (torch.randn(512, 770, generator=g).to(bf), torch.randn(1003, 770, generator=g).to(bf),
                torch.randn(1003, generator=g).to(bf))
        fn = lambda h, w, b: F.linear(h, w, b)  # noqa: E731
    else:  # grad_W = grad_logits^T @ h: A is column-major with an unaligned leading dimension
        args = (torch.randn(512, 1003, generator=g).to(bf), torch.randn(512, 768, generator=g).to(bf))
        fn = lambda gl, h: gl.t() @ h  # noqa: E731
    gm = traced(fn, *args)
    kept = traced(fn, *args)  # a training forward's outputs keep eager's layout
    assert [r.rule for r in pad_unaligned_matmuls(kept, require_cuda=False)] == ["pad-matmul"]
    assert kept(*args).stride() == fn(*args).stride()
    done = pad_unaligned_matmuls(gm, require_cuda=False, padded_outputs=True)
    assert [r.rule for r in done] == ["pad-matmul"]
    assert aten.constant_pad_nd.default in targets(gm)
    out, ref = gm(*args), fn(*args)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    if case == "transposed_a":  # only A's rows were padded: the output is eager's
        assert out.stride() == ref.stride()
    else:  # no contiguous copy of the output: its rows keep the padded matmul's stride, as Inductor's do
        assert out.stride()[-2:] == (1008, 1)
        out.view(-1, 1003)  # views that merge leading dims work as on eager's output


def test_aligned_or_small_matmuls_are_left_alone():
    a, b = torch.randn(512, 768).bfloat16(), torch.randn(768, 1024).bfloat16()
    gm = traced(lambda a, b: a @ b, a, b)
    assert pad_unaligned_matmuls(gm, require_cuda=False) == []
    small = traced(lambda a, b: a @ b, torch.randn(4, 7).bfloat16(), torch.randn(7, 3).bfloat16())
    assert pad_unaligned_matmuls(small, require_cuda=False) == []


def test_transposed_operands_are_padded_in_their_memory_order():
    # b = w.t() is column-major: padding it directly would be a transposing copy
    h, w = torch.randn(512, 768).bfloat16(), torch.randn(1003, 768).bfloat16()
    gm = traced(lambda h, w: h @ w.t(), h, w)
    pad_unaligned_matmuls(gm, require_cuda=False)
    pads = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    assert len(pads) == 1 and pads[0].meta["val"].shape == (1008, 768)  # w's rows, in w's layout


def test_gather_passes_through_a_float_copy_with_device_arguments():
    logits, target = torch.randn(16, 1003).bfloat16(), torch.randint(0, 1003, (16,))

    def loss(l, t):
        return F.cross_entropy(l.to(dtype=torch.float32, device=l.device), t)

    gm = traced(loss, logits, target)
    assert gather_through_pointwise(gm)
    assert [n.args[0].op for n in gm.graph.nodes if n.target is aten.gather.default] == ["placeholder"]


def test_gather_passes_through_the_reshape_of_a_causal_lm_loss():
    # transformers' ForCausalLMLoss: logits.float(), then .view(-1, vocab), then cross_entropy
    logits, labels = torch.randn(2, 8, 1003).bfloat16(), torch.randint(0, 1003, (2, 8))

    def loss(l, t):
        return F.cross_entropy(l.float().view(-1, 1003), t.view(-1))

    gm = traced(loss, logits, labels)
    assert gather_through_pointwise(gm)
    gathers = [n for n in gm.graph.nodes if n.target is aten.gather.default]
    assert len(gathers) == 1 and gathers[0].meta["val"].dtype == torch.bfloat16  # reads the logits themselves
    torch.testing.assert_close(gm(logits, labels), loss(logits, labels), rtol=1e-5, atol=1e-5)


def test_causal_lm_loss_views_the_logits_before_converting_them():
    from fuselens.compiler.graph_passes import reshapes_before_pointwise

    logits, labels = torch.randn(2, 8, 1003).bfloat16(), torch.randint(0, 1003, (2, 8))

    def loss(l, t):
        return F.cross_entropy(l.float().view(-1, 1003), t.view(-1))

    gm = traced(loss, logits, labels)
    gather_through_pointwise(gm)
    assert reshapes_before_pointwise(gm)
    # the float conversion now runs on the [16, 1003] view, the shape of the row reductions
    converts = [n for n in gm.graph.nodes if n.target in (aten._to_copy.default, torch.ops.prims.convert_element_type.default)
                and n.meta["val"].numel() == 16 * 1003]
    assert converts and all(tuple(n.meta["val"].shape) == (16, 1003) for n in converts)
    torch.testing.assert_close(gm(logits, labels), loss(logits, labels), rtol=1e-5, atol=1e-5)


def test_causal_lm_loss_compiles_to_one_row_kernel_without_a_float_copy():
    logits, labels = torch.randn(2, 8, 1003).bfloat16(), torch.randint(0, 1003, (2, 8))

    def loss(l, t):
        return F.cross_entropy(l.float().view(-1, 1003), t.view(-1))

    with sink.collect() as events:
        out = torch.compile(loss, backend="fuselens")(logits, labels)
    torch.testing.assert_close(out, loss(logits, labels), rtol=1e-5, atol=1e-5)
    from fuselens.events import Kernel

    kernels = [k for k in events if isinstance(k, Kernel) and k.kind == "cpp"]
    copies = [k for k in kernels if set(k.ops) <= {"aten._to_copy.default", "prims.convert_element_type.default"}]
    assert not copies, [k.name for k in kernels]


def test_embedding_backward_accumulates_with_index_add_including_repeats_and_negative_indices():
    def put(table, idx, grad):
        return torch.ops.aten.index_put.default(table, [idx], grad, True)

    g = torch.Generator().manual_seed(0)
    idx = torch.tensor([[3, 1, 3], [-1, 0, 3]])  # repeated rows add up; -1 is the last row
    args = (torch.zeros(7, 5), idx, torch.randn(2, 3, 5, generator=g))
    gm = traced(put, *args)
    done = index_put_accumulate_as_index_add(gm, require_cuda=False)
    assert [r.rule for r in done] == ["index-add"]
    assert aten.index_add.default in targets(gm) and aten.index_put.default not in targets(gm)
    torch.testing.assert_close(gm(*args), put(*args))


def test_embedding_gradient_through_the_rewrite_equals_eager():
    emb = torch.nn.Embedding(11, 4)
    ids = torch.tensor([[1, 2, 2, 10], [0, 2, 5, 1]])
    gm = traced(lambda w, i: torch.ops.aten.embedding_dense_backward.default(w, i, 11, -1, False),
                torch.randn(2, 4, 4), ids)
    assert [r.rule for r in index_put_accumulate_as_index_add(gm, require_cuda=False)] == ["index-add"]
    grad = torch.randn(2, 4, 4)
    emb(ids).backward(grad)
    torch.testing.assert_close(gm(grad, ids), emb.weight.grad)


def test_an_outer_product_of_indices_accumulates_with_an_index_add_per_dim():
    """x[:, rows[:, None], cols] += v with repeats and negative indices (what an interpolation's
    backward scatters): an index_add along each indexed dim, the result index_put's. Indices
    that pair up element by element (not an outer product) are left alone."""
    def put(x, rows, cols, v):
        return torch.ops.aten.index_put.default(x, [None, rows[:, None], cols], v, True)

    g = torch.Generator().manual_seed(0)
    rows, cols = torch.tensor([0, 0, 2, -1]), torch.tensor([1, 3, 3])
    args = (torch.randn(2, 5, 4, 3, generator=g), rows, cols, torch.randn(2, 4, 3, 3, generator=g))
    gm = traced(put, *args)
    assert [r.rule for r in index_put_accumulate_as_index_add(gm, require_cuda=False)] == ["index-add"]
    assert targets(gm).count(aten.index_add.default) == 2 and aten.index_put.default not in targets(gm)
    torch.testing.assert_close(gm(*args), put(*args))
    half = (args[0].bfloat16(), rows, cols, args[3].bfloat16())  # summed in float, rounded once
    gm = traced(put, *half)
    assert [r.rule for r in index_put_accumulate_as_index_add(gm, require_cuda=False)] == ["index-add"]
    exact = put(args[0].bfloat16().double(), rows, cols, args[3].bfloat16().double())
    torch.testing.assert_close(gm(*half).double(), exact, rtol=2 ** -8, atol=0)

    def paired(x, rows, cols, v):
        return torch.ops.aten.index_put.default(x, [None, rows, cols], v, True)

    gm = traced(paired, torch.zeros(2, 5, 4), torch.tensor([0, 2]), torch.tensor([1, 1]), torch.randn(2, 2))
    assert index_put_accumulate_as_index_add(gm, require_cuda=False) == []


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear", "bicubic"])
def test_interpolation_gradients_are_eagers_with_no_op_left_to_aten(mode):
    """Every `F.interpolate` backward scatters with an index_put over an outer product of
    row and column indices, which ATen ran (a "runs in ATen" finding in every UNet's and
    FPN's training report): it is an index_add per dim now, with eager's gradients."""
    from fuselens.events import ErrorEntry

    torch._dynamo.reset()
    x = torch.randn(2, 3, 10, 8, requires_grad=True)

    def f(t):
        return F.interpolate(t, scale_factor=2, mode=mode) * 2

    with sink.collect() as events:
        out = torch.compile(f, backend="fuselens", options={"target": "cpp", "fallback_on_error": False})(x)
        g = torch.randn_like(out)
        (mine,) = torch.autograd.grad(out, x, g)
    torch.testing.assert_close(out, f(x))
    torch.testing.assert_close(mine, torch.autograd.grad(f(x), x, g)[0])
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]


def test_index_put_stays_under_deterministic_algorithms():
    def put(table, idx, grad):
        return torch.ops.aten.index_put.default(table, [idx], grad, True)

    gm = traced(put, torch.zeros(7, 5), torch.tensor([1, 1]), torch.randn(2, 5))
    torch.use_deterministic_algorithms(True)
    try:
        assert index_put_accumulate_as_index_add(gm, require_cuda=False) == []
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_gradient_feeding_two_matmuls_is_padded_once():
    # an LM head's backward: grad_h = g @ W and grad_W = g.t() @ h share the unaligned vocab dim
    g_ = torch.Generator().manual_seed(0)
    bf = torch.bfloat16
    args = (torch.randn(512, 1003, generator=g_).to(bf), torch.randn(1003, 768, generator=g_).to(bf),
            torch.randn(512, 768, generator=g_).to(bf))
    fn = lambda g, w, h: (g @ w, g.t() @ h)  # noqa: E731
    gm = traced(fn, *args)
    assert len(pad_unaligned_matmuls(gm, require_cuda=False)) == 2
    pads = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    g_pads = [p for p in pads if p.args[0].op == "placeholder" and p.args[0].meta["val"].shape == (512, 1003)]
    assert len(g_pads) == 1, [p.args for p in pads]
    for got, want in zip(gm(*args), fn(*args)):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-1)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_a_convolution_bias_becomes_an_add_with_eagers_values_and_layout(layout):
    # ConvNeXt's depthwise convolution: the bias add then fuses with the norm that reads it
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 8, 9, 9, generator=g), torch.randn(8, 1, 7, 7, generator=g), torch.randn(8, generator=g)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    conv = lambda x, w, b: F.conv2d(x, w, b, padding=3, groups=8)  # noqa: E731
    gm = traced(conv, x, w, b)
    assert [r.rule for r in convolution_bias_as_add(gm, require_cuda=False)] == ["conv-bias-add"]
    (c,) = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert c.args[2] is None and aten.add.Tensor in targets(gm)
    got, want = gm(x, w, b), conv(x, w, b)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


def test_a_convolution_without_bias_is_left_alone():
    gm = traced(lambda x, w: F.conv2d(x, w), torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3))
    assert convolution_bias_as_add(gm, require_cuda=False) == []


def test_cpu_embedding_backward_is_an_index_add_library_call_with_no_finding_and_eagers_gradient():
    """Every Hugging Face training report on the CPU said index_put "runs in ATen (no
    lowering)"; the C++ target takes the index_add rule too (a library call, faster there)."""
    from fuselens.events import ErrorEntry, Kernel

    torch.manual_seed(0)
    emb = torch.nn.Embedding(100, 16)
    ref = torch.nn.Embedding(100, 16)
    ref.load_state_dict(emb.state_dict())
    ids = torch.tensor([[1, 5, 5, 99, 1, 0]])  # repeats accumulate
    torch._dynamo.reset()
    with sink.collect() as events:
        (torch.compile(emb, backend="fuselens")(ids) ** 2).sum().backward()
    (ref(ids) ** 2).sum().backward()
    torch.testing.assert_close(emb.weight.grad, ref.weight.grad)
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]
    assert any(k.name.startswith("extern_index_add") for k in events if isinstance(k, Kernel))


@pytest.mark.parametrize("shape,reps,channels_last", [
    ((3, 4), (2, 3), False), ((3, 4), (2, 1, 3), False), ((5,), (4, 2), False),
    ((2, 3, 4, 4), (1, 2, 1, 3), True)])
def test_repeat_is_a_generated_copy_with_eager_values_layout_and_gradients(shape, reps, channels_last):
    """x.repeat(...) decomposes into one copy of x expanded (entry.py), not ATen's kernel of
    its own: values bit-equal, eager's contiguous result whatever x's layout (new leading
    dims too), the gradient eager's, and no op left to ATen."""
    from fuselens.events import ErrorEntry

    assert aten.repeat.default not in targets(traced(lambda t: t.repeat(*reps), torch.randn(shape)))
    torch._dynamo.reset()
    x = torch.randn(shape)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_(True)

    def f(t):
        return t.repeat(*reps) * 2

    with sink.collect() as events:
        out = torch.compile(f, backend="fuselens", options={"target": "cpp", "fallback_on_error": False})(x)
        g = torch.randn_like(out)
        (mine,) = torch.autograd.grad(out, x, g)
    ref = f(x)
    (theirs,) = torch.autograd.grad(ref, x, g)
    assert torch.equal(out, ref) and out.stride() == ref.stride()
    torch.testing.assert_close(mine, theirs)
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]


def test_an_inference_graph_computes_a_mask_each_layer_builds_from_one_input_once():
    """Every layer of an HF decoder turns the one boolean causal mask into the float mask
    SDPA takes (SDPA's `where`, with constants of its own); merged, the mask is one
    kernel for all layers, and the merge is reported."""
    def layers(q, k, v, keep):
        out = q
        for _ in range(3):
            out = F.scaled_dot_product_attention(out, k, v, attn_mask=keep)
        return out

    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    keep = torch.ones(16, 16, dtype=torch.bool).tril()
    torch._dynamo.reset()
    with torch.no_grad(), sink.collect() as events:
        got = torch.compile(layers, backend="fuselens")(q, k, v, keep)
    torch.testing.assert_close(got, layers(q, k, v, keep))
    merged = [e for e in events if isinstance(e, FusionDecision) and e.rule == "common-subexpression"]
    assert {e.nodes[0] for e in merged} >= {"where_1", "where_2"}, merged
    generated = [e for e in events if type(e).__name__ == "Kernel" and e.kind != "extern"]
    assert sum("aten.where.self" in k.ops for k in generated) == 1, [k.ops for k in generated]


def test_a_training_graph_is_not_merged_again_after_its_joint_graph():
    """The joint graph is merged before its partition (joint_cse.py); the forward and
    backward graphs are not walked a second time."""
    x = torch.randn(8, 8, requires_grad=True)
    torch._dynamo.reset()
    with sink.collect() as events:
        y = torch.compile(lambda t: (t.sin() + t.sin()).sum(), backend="fuselens")(x)
        y.backward()
    assert not [e for e in events if isinstance(e, FusionDecision) and e.rule == "common-subexpression"]
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def _dense_block(x, *features):
    """A DenseNet block's shape: each layer concatenates every feature map before it."""
    parts, outs = [x], []
    for f in features:
        parts.append(f)
        outs.append(torch.relu(torch.cat(parts, 1)) * 2)
    return outs


def test_a_cat_of_an_earlier_cats_parts_and_more_reads_that_cat():
    x, *fs = (torch.randn(2, 3 + i, 5) for i in range(5))
    gm = traced(_dense_block, x, *fs)
    done = cats_extend_earlier_cats(gm)
    cats = [n for n in gm.graph.nodes if n.target is aten.cat.default]
    assert [len(n.args[0]) for n in cats] == [2, 2, 2, 2]  # was 2, 3, 4, 5
    assert [n.args[0][0] for n in cats[1:]] == cats[:-1]
    assert [d.rule for d in done] == ["cat-extends-cat"] * 3
    for got, want in zip(gm(x, *fs), _dense_block(x, *fs)):
        torch.testing.assert_close(got, want)


def test_a_cat_on_another_dim_or_with_other_leading_parts_is_left():
    a, b, c = (torch.randn(4, 4) for _ in range(3))
    gm = traced(lambda a, b, c: (torch.cat([a, b], 0), torch.cat([a, b, c], 1), torch.cat([b, a, c], 0)), a, b, c)
    assert cats_extend_earlier_cats(gm) == []


def test_a_dense_block_trains_like_eager_with_each_cat_extending_the_last():
    x, *fs = (torch.randn(2, 3 + i, 5, requires_grad=True) for i in range(4))
    torch._dynamo.reset()
    with sink.collect() as events:
        outs = torch.compile(_dense_block, backend="fuselens")(x, *fs)
        sum(o.square().sum() for o in outs).backward()
    grads = [t.grad.clone() for t in (x, *fs)]
    for t in (x, *fs):
        t.grad = None
    sum(o.square().sum() for o in _dense_block(x, *fs)).backward()
    for got, t in zip(grads, (x, *fs)):
        torch.testing.assert_close(got, t.grad)
    assert len([e for e in events if isinstance(e, FusionDecision) and e.rule == "cat-extends-cat"]) == 2


def test_a_chain_of_cats_each_extending_the_last_is_not_recomputed_link_by_link_without_bound():
    """Each cat reads the last (cat-extends-cat); inlined link by link, each link cheap
    alone, the last layer's kernel recomputed every cat before it (DenseNet-121 on this
    CPU: 27 ms for one kernel). A cat another cat extends stays stored."""
    # features narrow next to the cats (DenseNet's 32 channels against hundreds): a reader
    # of a recomputed cat loads no wider buffers than the cat
    x, fs = torch.randn(2, 64, 5), [torch.randn(2, 2, 5) for _ in range(12)]
    torch._dynamo.reset()
    with torch.no_grad(), sink.collect() as events:
        outs = torch.compile(_dense_block, backend="fuselens")(x, *fs)
    for got, want in zip(outs, _dense_block(x, *fs)):
        torch.testing.assert_close(got, want)
    kernels = [e for e in events if type(e).__name__ == "Kernel" and e.kind != "extern"]
    cats_in = [sum(n.startswith("cat") for n in k.nodes) for k in kernels]
    assert max(cats_in) == 1, cats_in  # recomputed link by link, the last layer's kernel computed all 12
    assert any("a cat that another cat extends" in e.reason for e in events if isinstance(e, FusionDecision))
