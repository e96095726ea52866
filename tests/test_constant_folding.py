"""Constant folding (fuselens/compiler/constant_folding.py): what reads no input is
computed once at compile time, forward and backward, and nothing else is."""

from __future__ import annotations

import pytest
import torch

import fuselens.compiler  # noqa: F401  (registers backend="fuselens")
from fuselens import sink
from fuselens.events import ErrorEntry, FusionDecision, Kernel


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _shifted_window_mask(x: torch.Tensor, size: int = 8, window: int = 4, shift: int = 2) -> torch.Tensor:
    """torchvision Swin's attention mask: built in every forward from Python numbers."""
    mask = x.new_zeros((size, size))
    count = 0
    for h in ((0, -window), (-window, -shift), (-shift, None)):
        for w in ((0, -window), (-window, -shift), (-shift, None)):
            mask[h[0]:h[1], w[0]:w[1]] = count
            count += 1
    mask = mask.view(size // window, window, size // window, window).permute(0, 2, 1, 3).reshape(-1, window * window)
    mask = mask.unsqueeze(1) - mask.unsqueeze(2)
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


def _attention_with_mask(x: torch.Tensor) -> torch.Tensor:
    # x: [windows, tokens, tokens]; the mask is added to every batch's scores
    return torch.softmax(x + _shifted_window_mask(x).unsqueeze(0), dim=-1)


def _compile(fn, *args):
    with sink.collect() as events:
        out = torch.compile(fn, backend="fuselens")(*args)
    errors = [e for e in events if isinstance(e, ErrorEntry) and e.kind in ("compile", "internal")]
    assert not errors, errors[0].message
    return out, events


def _folds(events):
    return [e for e in events if isinstance(e, FusionDecision) and e.rule == "constant-fold"]


def test_swin_window_mask_is_computed_once_at_compile_time():
    x = torch.randn(2, 4, 16, 16)
    out, events = _compile(_attention_with_mask, x)
    torch.testing.assert_close(out, _attention_with_mask(x))
    (fold,) = _folds(events)
    assert "4x16x16 float32" in fold.reason and "read no input" in fold.reason
    # what is left is the add and softmax: one kernel, no slice writes of the mask
    kernels = [e for e in events if isinstance(e, Kernel)]
    assert len(kernels) == 1, [k.name for k in kernels]


def test_folding_drops_the_mask_kernels_it_replaces():
    x = torch.randn(2, 4, 16, 16)
    _, events = _compile(_attention_with_mask, x)
    torch._dynamo.reset()
    from unittest import mock

    with mock.patch("fuselens.compiler.constant_folding.fold_constants", lambda gm: []):
        _, unfolded = _compile(_attention_with_mask, x)
    count = lambda evs: sum(isinstance(e, Kernel) for e in evs)  # noqa: E731
    assert count(events) < count(unfolded)


def test_mask_gradient_flows_around_the_folded_constant():
    x = torch.randn(2, 4, 16, 16, requires_grad=True)
    g = torch.randn(2, 4, 16, 16)
    out, events = _compile(_attention_with_mask, x)
    (grad,) = torch.autograd.grad(out, x, g)
    x_ref = x.detach().requires_grad_()
    (grad_ref,) = torch.autograd.grad(_attention_with_mask(x_ref), x_ref, g)
    torch.testing.assert_close(grad, grad_ref)
    assert _folds(events)


def test_index_arithmetic_of_a_roll_is_not_folded_into_a_buffer():
    # a roll's indices are arange arithmetic: kernels compute them from the loop index
    x = torch.randn(6, 10)
    out, events = _compile(lambda t: torch.roll(t, 3, dims=1) * 2, x)
    torch.testing.assert_close(out, torch.roll(x, 3, dims=1) * 2)
    assert not _folds(events)


def test_random_numbers_are_never_folded():
    def noisy(t):
        return t + torch.rand(8) * torch.tensor(2.0)

    x = torch.zeros(8)
    fn = torch.compile(noisy, backend="fuselens")
    with sink.collect() as events:
        a = fn(x)
    b = fn(x)
    assert not torch.equal(a, b)
    assert not _folds(events)


def test_a_uniform_constant_stays_computed_inline():
    # a literal broadcast to a block of one repeated value: a buffer would only be read from memory
    def f(t):
        return t * (t.new_ones(64, 64) * torch.tensor(3.0))

    x = torch.randn(64, 64)
    out, events = _compile(f, x)
    torch.testing.assert_close(out, f(x))
    assert not _folds(events)


def test_a_mask_built_from_ones_becomes_one_number_its_where_reads_without_masking():
    """A Hugging Face model called without an attention mask builds one from `ones`
    (DeBERTa: ones * ones != 0, negated, then masked_fill): the subgraph is one number
    repeated and becomes a `full` of it. A `where` on it keeps one branch in the Triton
    kernel (its loads were masked by a 0-d constant, which Triton's interpreter refuses)."""
    def f(scores):
        ones = torch.ones(scores.shape[0], scores.shape[-1], dtype=scores.dtype)
        keep = (ones[:, None, :] * ones[:, :, None]) != 0
        return torch.softmax(scores.masked_fill(~keep[:, None], torch.finfo(scores.dtype).min), -1)

    x = torch.randn(2, 4, 16, 16)
    out, events = _compile(f, x)
    torch.testing.assert_close(out, f(x))
    assert [e for e in _folds(events) if "one number repeated" in e.reason]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_a_literal_assigned_into_a_slice_is_a_number_in_the_kernel_not_a_buffer_it_reads(dtype):
    """T5's `_shift_right` (`ids[..., 0] = decoder_start_token_id`) lifts a 0-d CPU tensor
    that a fill reads next to the graph's own values. Read as a buffer, a CUDA kernel's
    launch copied it to the device at every call, which a CUDA-graph capture refuses."""
    from fuselens.compiler.runtime import wrapper_codegen

    def f(x):
        y = x.clone()
        y[..., 0] = 5
        return y * 2

    x = torch.arange(32).reshape(4, 8).to(dtype)
    with wrapper_codegen.recorded_sources() as sources:
        out, events = _compile(f, x)
    torch.testing.assert_close(out, f(x))
    launches = [ln for src in sources for ln in src.splitlines() if ".data_ptr()" in ln]
    assert launches and not [ln for ln in launches if "_tensor_constant" in ln], sources
    # nor is it bound at each call, a store on the hot path nothing reads
    assert not [src for src in sources if "_tensor_constant" in src], sources
