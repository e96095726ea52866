"""slice_scatter (a slice's backward: a rotary embedding's halves in a
Llama training step) is generated code that picks src inside the slice, else the
input; as ATen it was a copy of the input, a copy of src and a kernel each."""

from __future__ import annotations

import pytest
import torch

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from fuselens import sink
from fuselens.events import ErrorEntry, Kernel

OPTS = {"target": "cpp", "fallback_on_error": False}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="fuselens", options=OPTS)


def test_rotary_backward_slices_are_scattered_by_generated_kernels() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16, 32, requires_grad=True)
    cos, sin = torch.randn(16, 32), torch.randn(16, 32)

    def rotary(x: torch.Tensor) -> torch.Tensor:
        return (x * cos + _rotate_half(x) * sin).square().sum()

    with sink.collect() as events:
        (mine,) = torch.autograd.grad(_compiled(rotary)(x), x)
    (theirs,) = torch.autograd.grad(rotary(x), x)
    torch.testing.assert_close(mine, theirs)
    assert any("aten.slice_scatter.default" in k.ops for k in events if isinstance(k, Kernel) and k.kind == "cpp")
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]


@pytest.mark.parametrize("start, end", [(2, 5), (-3, None), (6, 100), (None, 4)])
def test_slice_scatter_bounds_as_aten_normalizes_them(start, end) -> None:
    torch.manual_seed(1)
    y = torch.randn(5, 9)
    src = torch.randn(5, len(range(9)[slice(start, end)]))

    def fn(y: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.slice_scatter(y, src, 1, start, end) * 2

    assert torch.equal(_compiled(fn)(y, src), fn(y, src))


@pytest.mark.parametrize("start, end, step", [(0, None, 2), (1, None, 2), (1, 8, 3), (-5, None, 2)])
def test_stepped_slice_scatter_writes_only_its_steps(start, end, step) -> None:
    torch.manual_seed(2)
    y = torch.randn(3, 9)
    src = torch.randn(3, len(range(9)[slice(start, end, step)]))

    def fn(y: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.slice_scatter(y, src, 1, start, end, step) * 2

    with sink.collect() as events:
        got = _compiled(fn)(y, src)
    assert torch.equal(got, fn(y, src))
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]


def test_patch_merging_backward_is_generated_code() -> None:
    # Swin's patch merging: four stepped slices of an image, joined along channels
    torch.manual_seed(3)
    x = torch.randn(2, 6, 8, 5, requires_grad=True)

    def merge(x: torch.Tensor) -> torch.Tensor:
        parts = (x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2])
        return torch.cat(parts, -1).square().sum()

    with sink.collect() as events:
        (mine,) = torch.autograd.grad(_compiled(merge)(x), x)
    (theirs,) = torch.autograd.grad(merge(x), x)
    torch.testing.assert_close(mine, theirs)
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]


@pytest.mark.parametrize("size, stride, offset", [((2, 6), (6, 1), 0), ((3, 2), (4, 1), 1), ((2, 3), (1, 5), 2),
                                                  ((4,), (3,), 2)])
def test_as_strided_scatter_writes_through_the_strided_view(size, stride, offset) -> None:
    torch.manual_seed(4)
    y, src = torch.randn(16), torch.randn(size)

    def fn(y: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return torch.as_strided_scatter(y * 1, src, size, stride, offset) + 1

    with sink.collect() as events:
        got = _compiled(fn)(y, src)
    assert torch.equal(got, fn(y, src))
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]
    assert any("aten.as_strided_scatter.default" in k.ops for k in events if isinstance(k, Kernel) and k.kind == "cpp")



def _chunks(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Longformer's `_chunk`: overlapping windows, by as_strided, of its queries: a view of the
    projection's output (sequence first) with the heads first, its dims permuted in memory."""
    q = (x @ w).view(32, 2, 4, 16).transpose(0, 1).transpose(1, 2).reshape(8, 32, 16)  # no copy: a view
    h = q.view(8, 4, 8, 16)
    size, stride = list(h.size()), list(h.stride())
    size[1], stride[1] = size[1] * 2 - 1, stride[1] // 2
    return (h.as_strided(size=size, stride=stride) * 2).sum(-1)


def test_overlapping_as_strided_windows_of_a_computed_tensor_are_generated_forward_and_backward() -> None:
    """An as_strided view of a value with no buffer of its own (a permuted view of a matmul's
    output) is read through the element each storage offset holds in its layout: forward and
    backward as eager's, none left to ATen (Longformer's chunks had been)."""
    torch.manual_seed(5)
    x, w = torch.randn(64, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)
    with sink.collect() as events:
        mine = torch.autograd.grad(_compiled(_chunks)(x, w).square().sum(), (x, w))
    theirs = torch.autograd.grad(_chunks(x, w).square().sum(), (x, w))
    for a, b in zip(mine, theirs):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()  # sums of 64 terms and more, in another order
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]


def test_an_as_strided_view_reaching_past_a_computed_tensors_elements_stays_atens_and_right() -> None:
    """Past the value's own elements lies memory of another tensor's (its base's): such a view
    stays ATen's, on the materialized value, and still equals eager."""
    torch.manual_seed(6)
    base = torch.randn(40)

    def fn(b: torch.Tensor) -> torch.Tensor:
        v = (b * 2)[:32]  # a view with more storage past its end
        return v.as_strided((4, 8), (8, 1), 4) + 1

    opts = {"target": "cpp"}
    torch._dynamo.reset()
    with sink.collect() as events:
        got = torch.compile(fn, backend="fuselens", options=opts)(base)
    assert torch.equal(got, fn(base))
    assert any("aten.as_strided" in e.message for e in events if isinstance(e, ErrorEntry))
