"""Ops decomposed into gathers at computed positions and comparisons, generated and fused
with the ops around them where ATen ran each as a kernel of its own: grid_sample
(spatial transformers, optical flow warps), adaptive average pooling with uneven
windows (pyramid pooling, `interpolate(mode="area")`) and bucketize. The backwards of
the first two stay ATen's own ops, and a finding says so."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuselens.compiler  # noqa: F401  (registers backend="fuselens")
from fuselens import sink
from fuselens.events import ErrorEntry

MODES = [("bilinear", "zeros", False), ("nearest", "border", True), ("bicubic", "reflection", False)]


def _warp(mode: str, padding: str, corners: bool):
    def warp(x, grid):
        return F.grid_sample(torch.relu(x), grid * 1.1, mode=mode, padding_mode=padding, align_corners=corners) * 2
    return warp


def _inputs():
    torch.manual_seed(0)
    return torch.randn(2, 3, 7, 6), torch.rand(2, 5, 4, 2) * 2.2 - 1.1  # some positions outside the image


@pytest.mark.parametrize("mode,padding,corners", MODES)
def test_grid_sample_is_generated_and_matches_eager(mode, padding, corners):
    fn, (x, grid) = _warp(mode, padding, corners), _inputs()
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(fn, backend="fuselens", options={"target": "cpp", "fallback_on_error": False})(x, grid)
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]
    torch.testing.assert_close(out, fn(x, grid))


def test_grid_sample_trains_like_eager_with_its_backward_left_to_aten_and_said():
    fn, (x, grid) = _warp("bilinear", "zeros", False), _inputs()
    xe, ge = x.clone().requires_grad_(), grid.clone().requires_grad_()
    fn(xe, ge).square().sum().backward()
    xc, gc = x.clone().requires_grad_(), grid.clone().requires_grad_()
    torch._dynamo.reset()
    with sink.collect() as events:
        torch.compile(fn, backend="fuselens", options={"target": "cpp"})(xc, gc).square().sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(gc.grad, ge.grad)
    said = [e.message for e in events if isinstance(e, ErrorEntry)]
    assert said and all("grid_sampler_2d_backward" in m for m in said), said


def test_adaptive_average_pooling_with_uneven_windows_is_generated_and_trains_like_eager():
    def pyramid(x):  # PSPNet's bins over an odd-sized map, and an area resize
        bins = [F.adaptive_avg_pool2d(x, b).flatten(1) for b in (2, 3)]
        return torch.cat(bins + [F.interpolate(x, size=(3, 5), mode="area").flatten(1)], 1)

    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 9)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref = pyramid(xe)
    ref.square().sum().backward()
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(pyramid, backend="fuselens", options={"target": "cpp"})(xc)
        out.square().sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(xc.grad, xe.grad)
    said = [e.message for e in events if isinstance(e, ErrorEntry)]
    assert said and all("_adaptive_avg_pool2d_backward" in m or "its backward" in m for m in said), said


def test_bucketize_is_generated_with_eagers_boundaries_both_ways():
    def buckets(v, edges):
        return torch.bucketize(v, edges) * 10 + torch.bucketize(v, edges, right=True)

    v = torch.tensor([[-2.0, -1.0, 0.0, 0.5], [1.0, 3.0, 0.0, -0.5]])
    edges = torch.tensor([-1.0, 0.0, 0.0, 1.0])
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(buckets, backend="fuselens", options={"target": "cpp", "fallback_on_error": False})(v, edges)
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]
    assert torch.equal(out, buckets(v, edges))
