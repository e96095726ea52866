"""avg_pool2d and its backward as generated kernels. ATen's were a kernel each between
fused ones: DenseNet's transitions, Inception's and GoogLeNet's branches, a ResNet-D's
shortcut, and every AvgPool1d, which pools a [N, C, 1, L] view through avg_pool2d.

Both follow ATen's kernels to the bit in float32: each window summed in row-major order
in float (double for float64), then divided by its divisor, which is ATen's:
`divisor_override`, or the window's size counting the padding (`count_include_pad`,
clipped at the padded edge) or not. A window that lies wholly in the padding (possible
with `ceil_mode`) gives 0. The backward gathers, for each input element, the output
gradients of the windows over it, each divided by its window's divisor, in ascending
output order: the order in which ATen's kernel scatters them.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, FloorDiv, TensorValue
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.pointwise import load_as
from fuselens.compiler.lowering.registry import NotLowered, aten, register
from fuselens.compiler.lowering.views import _clamp_index, _dense_stride, _inside, _pair

I64 = torch.int64


def _check(ctx: Lowerer, x: TensorValue, dtype: torch.dtype, what: str) -> None:
    if not dtype.is_floating_point or len(x.size) not in (3, 4):
        raise NotLowered(f"{what} of a non-float or non-image tensor")
    if not ctx.triton_target(ctx.out_meta()) and dtype not in (torch.float32, torch.float64):
        # ATen's CPU kernels sum 16-bit types in their own precision in places: not matched here
        raise NotLowered(f"16-bit {what} on the CPU")


def _window(ops: Any, o: Expr, s: int, p: int, k: int, n: Expr) -> tuple[Any, Any]:
    """(size counting the padding, size inside the input) of the window at output `o`
    along one dim, as ATen's kernels compute them."""
    start = ops.index_expr(o * s - p, I64)
    end = ops.minimum(ops.add(start, ops.constant(k, I64)), ops.index_expr(n + p, I64))
    padded = ops.sub(end, start)
    inside = ops.sub(ops.minimum(end, ops.index_expr(n, I64)), ops.maximum(start, ops.constant(0, I64)))
    return padded, inside


def _divisor(ops: Any, oh: Expr, ow: Expr, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int],
             hw: tuple[Expr, Expr], count_include_pad: bool, divisor_override: Optional[int],
             acc: torch.dtype) -> tuple[Any, Any]:
    """(the window's divisor as `acc`, whether the window has an input element)."""
    ph_, ih_ = _window(ops, oh, s[0], p[0], k[0], hw[0])
    pw_, iw_ = _window(ops, ow, s[1], p[1], k[1], hw[1])
    zero = ops.constant(0, I64)
    nonempty = ops.logical_and(ops.gt(ih_, zero), ops.gt(iw_, zero))
    if divisor_override:
        return ops.constant(float(divisor_override), acc), nonempty
    count = ops.mul(ph_, pw_) if count_include_pad else ops.mul(ih_, iw_)
    # an empty window's count may be 0 or negative: 1 keeps its (unused) quotient finite
    count = ops.where(nonempty, count, ops.constant(1, I64))
    return ops.to_dtype(count, acc), nonempty


@register(aten.avg_pool2d.default)
def lower_avg_pool2d(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                     padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                     divisor_override: Optional[int] = None) -> TensorValue:
    meta = ctx.out_meta()
    _check(ctx, x, meta.dtype, "avg_pool2d")
    k, p = _pair(kernel_size, ()), _pair(padding, (0,))
    s = _pair(stride, k)
    hw = (x.size[-2], x.size[-1])
    acc = torch.float64 if meta.dtype == torch.float64 else torch.float32
    bounded = p != (0, 0) or ceil_mode  # else every tap is inside the input by the output size's formula

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        *lead, oh, ow = idx
        zero = ops.constant(0, I64)
        total = ops.constant(0.0, acc)
        for i in range(k[0]):
            for j in range(k[1]):
                ih, iw = oh * s[0] - p[0] + i, ow * s[1] - p[1] + j
                v = load_as(ops, x, [*lead, _clamp_index(ih, hw[0]), _clamp_index(iw, hw[1])], acc, x.size)
                if bounded:
                    inside = ops.logical_and(_inside(ops, ih, hw[0], zero), _inside(ops, iw, hw[1], zero))
                    v = ops.where(inside, v, ops.constant(0.0, acc))
                total = ops.add(total, v)
        div, nonempty = _divisor(ops, oh, ow, k, s, p, hw, count_include_pad, divisor_override, acc)
        mean = ops.truediv(total, div)
        if bounded:
            mean = ops.where(nonempty, mean, ops.constant(0.0, acc))
        return ops.to_dtype(mean, meta.dtype)

    size = [ir.sympify_size(d) for d in meta.shape]
    return ctx.add_compute(body, size, meta.dtype, stride=_dense_stride(meta, size, ctx), name=ctx.current.name)


@register(aten.avg_pool2d_backward.default)
def lower_avg_pool2d_backward(ctx: Lowerer, grad: TensorValue, x: TensorValue, kernel_size: Sequence[int],
                              stride: Sequence[int], padding: Any, ceil_mode: bool, count_include_pad: bool,
                              divisor_override: Optional[int]) -> TensorValue:
    """Reads `x` for its shape alone (entry.py gives it a stand-in without data)."""
    meta = ctx.out_meta()
    _check(ctx, grad, meta.dtype, "avg_pool2d backward")
    k, p = _pair(kernel_size, ()), _pair(padding, (0,))
    s = _pair(stride, k)
    hw = (x.size[-2], x.size[-1])
    oh_n, ow_n = grad.size[-2], grad.size[-1]
    acc = torch.float64 if meta.dtype == torch.float64 else torch.float32

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        *lead, ih, iw = idx
        zero = ops.constant(0, I64)
        total = ops.constant(0.0, acc)
        for a in reversed(range(-(-k[0] // s[0]))):  # the windows over this row, top one first
            oh = FloorDiv(ih + p[0], s[0]) - a
            for b in reversed(range(-(-k[1] // s[1]))):
                ow = FloorDiv(iw + p[1], s[1]) - b
                covers = ops.logical_and(
                    ops.logical_and(_inside(ops, oh, oh_n, zero), _inside(ops, ow, ow_n, zero)),
                    ops.logical_and(ops.lt(ops.index_expr(ih + p[0] - oh * s[0], I64), ops.constant(k[0], I64)),
                                    ops.lt(ops.index_expr(iw + p[1] - ow * s[1], I64), ops.constant(k[1], I64))))
                at = [*lead, _clamp_index(oh, oh_n), _clamp_index(ow, ow_n)]
                div, _ = _divisor(ops, oh, ow, k, s, p, hw, count_include_pad, divisor_override, acc)
                g = ops.truediv(load_as(ops, grad, at, acc, grad.size), div)
                total = ops.add(total, ops.where(covers, g, ops.constant(0.0, acc)))
        return ops.to_dtype(total, meta.dtype)

    size = [ir.sympify_size(d) for d in meta.shape]
    return ctx.add_compute(body, size, meta.dtype, stride=ctx.out_stride(size))
