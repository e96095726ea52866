"""Kernels that read one buffer at the same elements share one read of it, when a lone
pointwise node loops in its output's memory order to line up with the others (a cast
keeps its input's layout): attention's saved probabilities, read by the softmax
backward and by their cast for the value gradient's bmm. And a reader that recomputes
such a node inline still reads the right elements."""

from __future__ import annotations

import torch

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from compiled_helpers import cpp_kernels, fresh_dynamo, run  # noqa: F401  (fresh_dynamo: autouse fixture)


def test_a_cast_of_a_transposed_view_loops_in_its_memory_order_and_joins_the_kernel():
    """Eager's cast keeps its input's layout, so the cast of softmax(x).transpose is the
    softmax's memory in the softmax's order. Looped in its logical (transposed) order it
    would read the softmax at other positions than its kernel computes them; looped in
    memory order it joins that kernel, and its result keeps eager's strides."""
    def fn(x):
        return torch.softmax(x, -1).transpose(-1, -2).to(torch.float64)

    x = torch.randn(2, 3, 16, 16)
    events = run(fn, x)
    assert len(cpp_kernels(events)) == 1
    out = torch.compile(fn, backend="fuselens")(x)
    assert out.stride() == fn(x).stride()
    torch.testing.assert_close(out, fn(x))


def test_two_kernels_reading_one_input_at_the_same_elements_read_it_once():
    """The softmax backward (a row sum) and the cast of the same saved probabilities for
    the value gradient's bmm have no buffer between them, and their loops line up only
    through a view ([B*H, S, S] against [B, H, S, S]): one kernel reads the probabilities
    once. Reading a transposed copy does not join (a different element per iteration)."""
    def fn(p, g):
        grad = p * g - p * (p * g).sum(-1, keepdim=True)
        return grad, p.view(6, 16, 16).to(torch.float64)

    p, g = torch.rand(2, 3, 16, 16), torch.randn(2, 3, 16, 16)
    events = run(fn, p, g)
    assert len(cpp_kernels(events)) == 1

    def transposed(p, g):  # a transposed copy: its memory is in another order than p's
        grad = p * g - p * (p * g).sum(-1, keepdim=True)
        return grad, p.transpose(-1, -2).contiguous().view(6, 16, 16).to(torch.float64)

    assert len(cpp_kernels(run(transposed, p, g))) == 2

    def far_apart(p, g, others):  # a backward runs other branches between the two readers
        cast = p.view(6, 16, 16).to(torch.float64)
        sums = [torch.sin(o).sum(0) for o in others]
        return cast, sums, p * g - p * (p * g).sum(-1, keepdim=True)

    others = [torch.randn(k + 9, 3) for k in range(10)]  # reductions of their own (not unrolled)
    assert len(cpp_kernels(run(far_apart, p, g, others))) == 11


def test_a_reader_joining_its_producer_also_takes_the_earlier_kernel_reading_its_input():
    """In a backward the softmax backward's first product joins its incoming gradient's
    kernel (its producer), while the cast of the same saved probabilities for the value
    gradient's bmm made a kernel of its own before it: that kernel is pulled into the
    later one, and the probabilities are read once."""
    def fn(p, a, b):
        cast = p.view(6, 16, 16).to(torch.float64)
        g = torch.bmm(a, b).view(2, 3, 16, 16) * 2  # a kernel after the library call
        return cast, p * g - p * (p * g).sum(-1, keepdim=True)

    p, a, b = torch.rand(2, 3, 16, 16), torch.randn(6, 16, 8), torch.randn(6, 8, 16)
    assert len(cpp_kernels(run(fn, p, a, b))) == 1

    def transposed(p, a, b):  # the cast of a transposed copy reads other elements per iteration: not joined
        cast = p.transpose(-1, -2).contiguous().view(6, 16, 16).to(torch.float64)
        g = torch.bmm(a, b).view(2, 3, 16, 16) * 2
        return cast, p * g - p * (p * g).sum(-1, keepdim=True)

    assert len(cpp_kernels(run(transposed, p, a, b))) == 2


def test_the_cast_of_transposed_probabilities_loops_in_their_memory_order_to_read_them_once():
    """The value gradient's bmm reads the probabilities transposed, and their cast keeps
    that layout (eager's `_to_copy`): it is their memory in their own order. Looped in
    its logical (transposed) order it read each probability elsewhere than the softmax
    backward does, so the two kernels read them twice (BERT's attention backward under
    torch 2.11: 100 MB of float32 a layer); looped in memory order it joins. Square and
    non-square (cross-attention) rows, the cast made before or after the softmax backward."""
    def cast_first(p, g):
        cast = p.transpose(-1, -2).reshape(6, p.shape[-1], p.shape[-2]).to(torch.float64)
        return cast, p * g - p * (p * g).sum(-1, keepdim=True)

    def cast_last(p, g):
        grad = p * g - p * (p * g).sum(-1, keepdim=True)
        return grad, p.transpose(-1, -2).reshape(6, p.shape[-1], p.shape[-2]).to(torch.float64)

    for shape in ((2, 3, 16, 16), (2, 3, 16, 8)):
        p, g = torch.rand(shape), torch.randn(shape)
        for fn in (cast_first, cast_last):
            # static shapes: the second shape would recompile with symbolic strides
            assert len(cpp_kernels(run(fn, p, g, dynamic=False))) == 1, (shape, fn.__name__)
            out = torch.compile(fn, backend="fuselens", dynamic=False)(p, g)
            assert [o.stride() for o in out] == [o.stride() for o in fn(p, g)]
            assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(out, fn(p, g)))


def test_a_reader_recomputing_a_producer_whose_loops_were_reordered_reads_the_right_elements():
    """T5's attention under bf16 autocast: the keys' float copy, transposed for the
    scores (`kt`), loops in its memory order to join the kernel that copies the keys
    (horizontal fusion: one read of the projection), and the cast of its transpose for
    a bmm (`r`) recomputes it inline. The reader indexes `kt` in the dims it was
    lowered with, which its reordered loops no longer take: every decoder query's
    gradient came out 1.4x off (training, CPU and GPU)."""
    def fn(x):
        k = x.view(2, 128, 4, 64).transpose(1, 2)
        kc = k.contiguous()
        kt = kc.float().transpose(-1, -2) * 1.0
        r = kt.transpose(-1, -2).reshape(8, 128, 64).to(torch.bfloat16)
        return kc, kt, r

    x = torch.randn(2, 128, 256).to(torch.bfloat16)
    out = torch.compile(fn, backend="fuselens", dynamic=False)(x)
    for got, want in zip(out, fn(x)):
        assert got.stride() == want.stride()
        assert torch.equal(got, want)


def test_a_channels_last_residual_sum_loops_in_memory_order_inside_the_layer_norm_reading_it():
    """A ConvNeXt stage's last residual sum is NCHW by its dims over NHWC memory, and the
    downsampling's LayerNorm reads it permuted to NHWC. The sum derives from an earlier
    LayerNorm (the stem's), so it is not recomputed inside the reader; in its logical
    order its kernel would be read at other positions (three kernels: the first
    LayerNorm, the sum, the second). Looped in memory order it is the second LayerNorm's
    prologue, and all of it is one pass over the same rows."""
    def fn(x, y, scale, w, b):
        h = torch.nn.functional.layer_norm(y.permute(0, 2, 3, 1), (8,), w, b).permute(0, 3, 1, 2)
        z = scale * x + h
        return torch.nn.functional.layer_norm(z.permute(0, 2, 3, 1), (8,), w, b)

    x, y = (torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last).bfloat16() for _ in range(2))
    scale, w, b = (torch.randn(*shape).bfloat16() for shape in ((8, 1, 1), (8,), (8,)))
    events = run(fn, x, y, scale, w, b)
    assert len(cpp_kernels(events)) == 1, [k.name for k in cpp_kernels(events)]
    torch.testing.assert_close(torch.compile(fn, backend="fuselens")(x, y, scale, w, b), fn(x, y, scale, w, b))
