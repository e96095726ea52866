"""avg_pool2d, avg_pool3d and their backwards as generated kernels. ATen's were a kernel
each between fused ones: DenseNet's transitions, Inception's and GoogLeNet's branches, a
ResNet-D's shortcut, every AvgPool1d (it pools a [N, C, 1, L] view through avg_pool2d),
and video and volume networks' 3-d pools.

All follow ATen's kernels to the bit in float32: each window summed in row-major order
in float (double for float64), then divided by its divisor, which is ATen's:
`divisor_override`, or the window's size counting the padding (`count_include_pad`,
clipped at the padded edge) or not. A window that lies wholly in the padding (possible
with `ceil_mode`) gives 0. The backward gathers, for each input element, the output
gradients of the windows over it, each divided by its window's divisor, in ascending
output order: the order in which ATen's kernel scatters them.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence

import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, TensorValue
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.pointwise import load_as
from fuselens.compiler.lowering.registry import NotLowered, aten, register
from fuselens.compiler.lowering.pool_windows import inside_all, pool_tuple, windows_over
from fuselens.compiler.lowering.views import _clamp_index, _dense_stride

I64 = torch.int64


def _args(x: TensorValue, nd: int, kernel_size: Any, stride: Any, padding: Any) -> tuple:
    k = pool_tuple(kernel_size, nd, ())
    return k, pool_tuple(stride, nd, k), pool_tuple(padding, nd, (0,)), tuple(x.size[-nd:])


def _check(x: TensorValue, dtype: torch.dtype, nd: int, what: str) -> None:
    if not dtype.is_floating_point or len(x.size) not in (nd + 1, nd + 2):
        raise NotLowered(f"{what} of a non-float tensor or one of other dims")


def _window(ops: Any, o: Expr, s: int, p: int, k: int, n: Expr) -> tuple[Any, Any]:
    """(size counting the padding, size inside the input) of the window at output `o`
    along one dim, as ATen's kernels compute them."""
    start = ops.index_expr(o * s - p, I64)
    end = ops.minimum(ops.add(start, ops.constant(k, I64)), ops.index_expr(n + p, I64))
    padded = ops.sub(end, start)
    inside = ops.sub(ops.minimum(end, ops.index_expr(n, I64)), ops.maximum(start, ops.constant(0, I64)))
    return padded, inside


def _divisor(ops: Any, outs: Sequence[Expr], k: Sequence[int], s: Sequence[int], p: Sequence[int],
             sizes: Sequence[Expr], count_include_pad: bool, divisor_override: Optional[int],
             acc: torch.dtype) -> tuple[Any, Any]:
    """(the window's divisor as `acc`, whether the window has an input element)."""
    zero = ops.constant(0, I64)
    padded = inside = nonempty = None
    for o, s_, p_, k_, n in zip(outs, s, p, k, sizes):
        a, b = _window(ops, o, s_, p_, k_, n)
        padded = a if padded is None else ops.mul(padded, a)
        inside = b if inside is None else ops.mul(inside, b)
        here = ops.gt(b, zero)
        nonempty = here if nonempty is None else ops.logical_and(nonempty, here)
    if divisor_override:
        return ops.constant(float(divisor_override), acc), nonempty
    count = padded if count_include_pad else inside
    # an empty window's count may be 0 or negative: 1 keeps its (unused) quotient finite
    count = ops.where(nonempty, count, ops.constant(1, I64))
    return ops.to_dtype(count, acc), nonempty


def _avg_pool(ctx: Lowerer, nd: int, x: TensorValue, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
              count_include_pad: bool, divisor_override: Optional[int]) -> TensorValue:
    meta = ctx.out_meta()
    _check(x, meta.dtype, nd, f"avg_pool{nd}d")
    k, s, p, sizes = _args(x, nd, kernel_size, stride, padding)
    acc = torch.float64 if meta.dtype == torch.float64 else torch.float32
    bounded = any(p) or ceil_mode  # else every tap is inside the input by the output size's formula

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        lead, outs = list(idx[:-nd]), list(idx[-nd:])
        total = ops.constant(0.0, acc)
        for taps in itertools.product(*(range(kk) for kk in k)):  # row-major, as ATen sums a window
            at = [o * s_ - p_ + t for o, s_, p_, t in zip(outs, s, p, taps)]
            v = load_as(ops, x, [*lead, *(_clamp_index(e, n) for e, n in zip(at, sizes))], acc, x.size)
            if bounded:
                v = ops.where(inside_all(ops, at, sizes), v, ops.constant(0.0, acc))
            total = ops.add(total, v)
        div, nonempty = _divisor(ops, outs, k, s, p, sizes, count_include_pad, divisor_override, acc)
        mean = ops.truediv(total, div)
        if bounded:
            mean = ops.where(nonempty, mean, ops.constant(0.0, acc))
        return ops.to_dtype(mean, meta.dtype)

    size = [ir.sympify_size(d) for d in meta.shape]
    return ctx.add_compute(body, size, meta.dtype, stride=_dense_stride(meta, size, ctx), name=ctx.current.name)


def _avg_pool_backward(ctx: Lowerer, nd: int, grad: TensorValue, x: TensorValue, kernel_size: Any, stride: Any,
                       padding: Any, count_include_pad: bool, divisor_override: Optional[int]) -> TensorValue:
    meta = ctx.out_meta()
    _check(grad, meta.dtype, nd, f"avg_pool{nd}d backward")
    k, s, p, sizes = _args(x, nd, kernel_size, stride, padding)
    out_sizes = list(grad.size[-nd:])
    acc = torch.float64 if meta.dtype == torch.float64 else torch.float32

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        lead, ins = list(idx[:-nd]), list(idx[-nd:])
        total = ops.constant(0.0, acc)
        for outs, covers in windows_over(ops, ins, k, s, p, out_sizes):
            at = [*lead, *(_clamp_index(o, n) for o, n in zip(outs, out_sizes))]
            div, _ = _divisor(ops, outs, k, s, p, sizes, count_include_pad, divisor_override, acc)
            g = ops.truediv(load_as(ops, grad, at, acc, grad.size), div)
            total = ops.add(total, ops.where(covers, g, ops.constant(0.0, acc)))
        return ops.to_dtype(total, meta.dtype)

    size = [ir.sympify_size(d) for d in meta.shape]
    return ctx.add_compute(body, size, meta.dtype, stride=ctx.out_stride(size))


@register(aten.avg_pool2d.default)
def lower_avg_pool2d(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                     padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                     divisor_override: Optional[int] = None) -> TensorValue:
    return _avg_pool(ctx, 2, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool3d.default)
def lower_avg_pool3d(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                     padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                     divisor_override: Optional[int] = None) -> TensorValue:
    return _avg_pool(ctx, 3, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool2d_backward.default)
def lower_avg_pool2d_backward(ctx: Lowerer, grad: TensorValue, x: TensorValue, kernel_size: Sequence[int],
                              stride: Sequence[int], padding: Any, ceil_mode: bool, count_include_pad: bool,
                              divisor_override: Optional[int]) -> TensorValue:
    """Reads `x` for its shape alone (entry.py gives it a stand-in without data)."""
    return _avg_pool_backward(ctx, 2, grad, x, kernel_size, stride, padding, count_include_pad, divisor_override)


@register(aten.avg_pool3d_backward.default)
def lower_avg_pool3d_backward(ctx: Lowerer, grad: TensorValue, x: TensorValue, kernel_size: Sequence[int],
                              stride: Sequence[int], padding: Any, ceil_mode: bool, count_include_pad: bool,
                              divisor_override: Optional[int]) -> TensorValue:
    return _avg_pool_backward(ctx, 3, grad, x, kernel_size, stride, padding, count_include_pad, divisor_override)
