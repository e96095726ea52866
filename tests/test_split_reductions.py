"""Split reductions (compiler/split_reductions.py): the rewritten graph computes
eager's values, in eager's dtypes and shapes, with the first reduction giving
enough partial results to fill a GPU of `SMS` multiprocessors.

The rule is the Triton target's; the graphs here are traced on CPU tensors and run
by ATen, and one training step runs through the C++ target with the rule applied."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import fuselens.compiler  # noqa: F401
import fuselens.sink
from fuselens.compiler.entry import decompositions
from fuselens.compiler.split_reductions import split_reductions
from fuselens.compiler.targets.cpp import CppTarget

aten = torch.ops.aten
SMS = 132


def traced(fn, *args):
    return make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(*args)


def reductions(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in
            (aten.sum.dim_IntList, aten.mean.dim, aten.var_mean.correction, aten.amax.default, aten.amin.default)]


def _batchnorm_stats(x):
    return torch.var_mean(x, [0, 2, 3], correction=0, keepdim=True)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_batchnorm_statistics_split_into_partials_match_eager(layout):
    x = torch.randn(16, 16, 64, 64) * 3 + 1
    if layout == "nhwc":
        x = x.to(memory_format=torch.channels_last)
    gm = traced(_batchnorm_stats, x)
    done = split_reductions(gm, SMS)
    assert [r.rule for r in done] == ["split-reduction"]
    first = next(n for n in gm.graph.nodes if n.target is aten.var_mean.correction)
    partials = first.meta["val"][0].numel()
    assert partials >= 16 * 16  # at least 16 partials a channel
    var, mean = gm(x)
    want_var, want_mean = _batchnorm_stats(x)
    assert var.shape == want_var.shape and mean.shape == want_mean.shape
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(var, want_var, rtol=1e-5, atol=1e-6)


def test_unbiased_variance_without_kept_dims_matches_eager():
    x = torch.randn(256, 4, 1024)
    fn = lambda x: torch.var_mean(x, [0, 2], correction=1)  # noqa: E731
    gm = traced(fn, x)
    assert split_reductions(gm, SMS)
    for got, want in zip(gm(x), fn(x)):
        assert got.shape == want.shape == (4,)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_bfloat16_column_sum_keeps_float_partials_and_eager_dtype():
    # a transformer's bias gradient: [tokens, hidden] summed over tokens
    x = torch.randn(4096, 768).bfloat16()
    gm = traced(lambda g: g.sum(0), x)
    assert split_reductions(gm, SMS)
    sums = [n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList]
    assert sums[0].meta["val"].dtype == torch.float32  # partials are not rounded to bf16
    out = gm(x)
    assert out.dtype == torch.bfloat16 and out.shape == (768,)
    torch.testing.assert_close(out, x.float().sum(0).bfloat16(), rtol=0, atol=0.25)


def test_sum_over_a_view_that_merged_dims_splits_the_tensor_under_the_view():
    # GPT-2's bias gradient: grad.view(8 * 512, 2304).sum(0); split inside the merged 4096-dim,
    # the partials would index the [8, 512, 2304] tensor through division and remainder
    g = torch.randn(8, 512, 2304).bfloat16()
    gm = traced(lambda g: g.view(-1, 2304).sum(0), g)
    assert split_reductions(gm, SMS)
    first = next(n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList)
    viewed = first.args[0]
    assert viewed.op == "placeholder" or viewed.args[0].op == "placeholder"  # a view of g itself
    out = gm(g)
    assert out.shape == (2304,) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, g.float().sum((0, 1)).bfloat16(), rtol=0, atol=0.5)


def test_mean_and_max_over_every_element_match_eager():
    x = torch.randn(256, 4100)
    fn = lambda x: (x.square().mean(), x.amax((0, 1)), x.amin((0, 1), keepdim=True))  # noqa: E731
    gm = traced(fn, x)
    assert len(split_reductions(gm, SMS)) == 3
    for got, want in zip(gm(x), fn(x)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_reductions_with_many_outputs_or_few_values_are_left_alone():
    rows = traced(lambda x: x.sum(-1), torch.randn(4096, 1024))  # one program a row: the GPU is full
    small = traced(lambda x: x.sum(0), torch.randn(64, 8))
    loss = traced(lambda x: x.mean(), torch.randn(8192))  # a loss: one short kernel, not two
    half_mean = traced(lambda x: x.mean(0), torch.randn(8192, 16).bfloat16())  # partials would round
    assert split_reductions(rows, SMS) == []
    assert split_reductions(small, SMS) == []
    assert split_reductions(loss, SMS) == []
    assert split_reductions(half_mean, SMS) == []
    assert len(reductions(rows)) == len(reductions(small)) == len(reductions(half_mean)) == 1


def test_a_norm_weight_gradient_over_2048_tokens_is_split():
    # Llama's RMSNorm weight gradient at 4 x 512 tokens: 16 column programs unsplit
    x, g = torch.randn(4, 512, 1024), torch.randn(4, 512, 1024)
    fn = lambda x, g: (x * g).sum((0, 1))  # noqa: E731
    gm = traced(fn, x, g)
    assert len(split_reductions(gm, SMS)) == 1
    torch.testing.assert_close(gm(x, g), fn(x, g), rtol=1e-5, atol=1e-4)


def test_batchnorm_statistics_of_few_channels_are_split_below_a_million_values():
    # MobileNetV3's 40 channels at 28x28, batch 32: 1.0M values that one program would read
    x = (torch.randn(32, 40, 28, 28) * 2 + 1).to(memory_format=torch.channels_last)
    gm = traced(_batchnorm_stats, x)
    assert [r.rule for r in split_reductions(gm, SMS)] == ["split-reduction"]
    for got, want in zip(gm(x), _batchnorm_stats(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_prime_reduced_dim_is_split_only_where_it_divides():
    x = torch.randn(8191, 300)  # 8191 is prime: no partials of equal size
    gm = traced(lambda x: x.sum(0), x)
    assert split_reductions(gm, SMS) == []


def test_a_prime_outer_dim_stays_whole_and_the_batch_dim_under_it_is_split():
    # ViT's q/k/v bias gradient: [197 tokens, 32 images, 2304] summed over tokens and images.
    # 197 is prime; unsplit, 36 programs read 6304 rows each
    g = torch.randn(197, 32, 2304).bfloat16()
    gm = traced(lambda g: g.sum((0, 1)), g)
    assert [r.rule for r in split_reductions(gm, SMS)] == ["split-reduction"]
    first = next(n for n in gm.graph.nodes if n.target is aten.sum.dim_IntList)
    assert first.meta["val"].numel() >= 8 * 2304  # the batch dim gives the partials
    out = gm(g)
    assert out.shape == (2304,) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out, g.float().sum((0, 1)).bfloat16(), rtol=0, atol=0.5)


def test_training_step_with_split_batchnorm_matches_eager_gradients(monkeypatch):
    own = CppTarget.graph_rewrites

    def rewrites(self, gm, example_inputs, stage):  # the Triton target's rule, on the C++ target
        return own(self, gm, example_inputs, stage) + split_reductions(gm, SMS)

    monkeypatch.setattr(CppTarget, "graph_rewrites", rewrites)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 96 * 96, 4))
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 96 * 96, 4))
    model.load_state_dict(ref.state_dict())
    x = torch.randn(16, 3, 96, 96)  # BatchNorm: 8 channels of 147456 values
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fuselens")
    with fuselens.sink.collect() as events:
        F.mse_loss(compiled(x), torch.ones(16, 4)).backward()
    assert any(getattr(e, "rule", "") == "split-reduction" for e in events)
    F.mse_loss(ref(x), torch.ones(16, 4)).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    for a, b in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_getitem_users_of_a_split_var_mean_are_rewired():
    gm = traced(lambda x: torch.var_mean(x, [0, 2, 3], correction=0)[1] * 2, torch.randn(16, 16, 64, 64))
    assert split_reductions(gm, SMS)
    assert all(n.args[0].target is not aten.var_mean.correction or n.args[0].meta["val"][0].dim() == 5
               for n in gm.graph.nodes if n.target is operator.getitem)
