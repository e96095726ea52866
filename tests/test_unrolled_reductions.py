"""Reductions over at most eight elements (known at compile time) along dims other than the
last are pointwise nodes that combine the elements one after another: they run in the
loop of whatever reads them instead of a kernel of their own. Mixtral sums each token's
two expert outputs, and a grouped-query attention's backward sums the gradients of the
heads sharing a key. Along the last dim they stay row reductions, whose kernel holds the
row's producers and readers (a softmax over 8 experts)."""

from __future__ import annotations

import pytest
import torch

from compiled_helpers import cpp_kernels, fresh_dynamo, run  # noqa: F401 - fixture
from fuselens import sink
from fuselens.compiler.lowering.reductions import UNROLL_AT_MOST
from fuselens.events import FusionDecision


def _experts_combined_then_rms_normalized(weighted, resid, g):
    t, h = resid.shape
    h_new = resid + weighted.view(t, -1, h).sum(1)
    var = h_new.pow(2).mean(-1, keepdim=True)
    return g * h_new * torch.rsqrt(var + 1e-6)


def test_a_sum_over_two_experts_runs_inside_the_normalization_kernel_that_reads_it():
    weighted, resid, g = torch.randn(64 * 2, 128), torch.randn(64, 128), torch.randn(128)
    events = run(_experts_combined_then_rms_normalized, weighted, resid, g)
    assert len(cpp_kernels(events)) == 1, [k.name for k in cpp_kernels(events)]
    said = " ".join(e.reason for e in events if isinstance(e, FusionDecision))
    assert "sum_1 (aten.sum.dim_IntList): sum over 2, unrolled: pointwise 64x128" in said, said


def test_a_sum_over_more_than_eight_elements_stays_a_reduction():
    weighted, resid, g = torch.randn(64 * (UNROLL_AT_MOST + 1), 128), torch.randn(64, 128), torch.randn(128)
    events = run(_experts_combined_then_rms_normalized, weighted, resid, g)
    said = " ".join(e.reason for e in events if isinstance(e, FusionDecision))
    assert f"sum_1 (aten.sum.dim_IntList): sum over {UNROLL_AT_MOST + 1} of 64x{UNROLL_AT_MOST + 1}x128" in said, said
    assert len(cpp_kernels(events)) == 2


_KINDS = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "prod": lambda x, d, k: x.prod(d[0], keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k),
    "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k),
    "argmax": lambda x, d, k: x.argmax(d[0], keepdim=k),
    "max_with_index": lambda x, d, k: x.max(d[0], keepdim=k),
    "any": lambda x, d, k: (x > 0.5).any(d[0], keepdim=k),
    "all": lambda x, d, k: (x > -0.5).all(d[0], keepdim=k),
}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_every_reduction_over_few_elements_matches_eager_with_nans_and_keepdim(kind, keepdim):
    x = torch.randn(5, 3, 7)
    x[1, 2, 3] = float("nan")
    x[2, :, 4] = float("nan")  # a whole row of NaNs: max and argmax pick the first
    dims = [1]
    events = run(lambda x: _KINDS[kind](x.float(), dims, keepdim) * 1, x)
    said = " ".join(e.reason for e in events if isinstance(e, FusionDecision))
    assert " over 3, unrolled: pointwise 5x" in said, said


@pytest.mark.parametrize("dims", [[0, 1], [1], [0], [1, 2]])
def test_a_sum_over_several_small_dims_and_of_integers_matches_eager(dims):
    x = torch.randint(-50, 50, (2, 3, 16), dtype=torch.int32)
    run(lambda x: x.sum(dims) + 1, x)
    y = torch.randn(2, 3, 16, dtype=torch.float64)
    run(lambda y: y.sum(dims, keepdim=True) * 2, y)


def test_a_softmax_over_eight_experts_stays_one_row_kernel():
    logits = torch.randn(64, 8)
    events = run(lambda x: torch.softmax(x, -1) * 2, logits)
    assert len(cpp_kernels(events)) == 1, [k.name for k in cpp_kernels(events)]


def test_grouped_query_gradients_summed_over_the_heads_sharing_a_key_match_eager():
    """The backward of expanding 2 key heads to 8 query heads sums over each group of 4."""
    torch.manual_seed(0)
    q = torch.randn(2, 8, 16, 32, requires_grad=True)
    k = torch.randn(2, 2, 16, 32, requires_grad=True)

    def f(q, k):
        kk = k[:, :, None].expand(2, 2, 4, 16, 32).reshape(2, 8, 16, 32)
        return (torch.tanh(q * kk) * 3).sum()

    with sink.collect():
        out = torch.compile(f, backend="fuselens")(q, k)
        out.backward()
    got = (q.grad.clone(), k.grad.clone())
    q.grad = k.grad = None
    f(q, k).backward()
    torch.testing.assert_close(got, (q.grad, k.grad))
