"""grid_sample (spatial transformers, optical flow warps, deformable sampling) is
decomposed into gathers at computed positions, which are generated and fused with the
ops around them; ATen ran it as a kernel of its own. Its backward stays ATen's own
`grid_sampler_2d_backward`, and a finding says so."""

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
