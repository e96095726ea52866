"""max_pool3d_with_indices and its backward as generated kernels (video and volume networks:
3-d ResNets, X3D, 3-d UNets), as max_pool2d's are in views.py: ATen ran each as a kernel of
its own between fused ones.

The forward is ATen's: each output is the max of its window's taps inside the input, taken
in row-major order, a later tap winning only when greater or NaN; its index is the winner's
flat offset in the input volume (D * H * W). The backward gathers, for each input element,
the output gradients of the windows that chose it, summed in float from zero in ascending
output order, as ATen's kernel scatters them. The indices stay int64 (what the backward
reads): max_pool2d's int8 window places are not used here.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, TensorValue
from fuselens.compiler.lowering.avg_pool import _inside_all, _tuple, windows_over
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.pointwise import load_as
from fuselens.compiler.lowering.registry import NotLowered, aten, register
from fuselens.compiler.lowering.views import _clamp_index, max_pool_outputs

I64 = torch.int64
ND = 3


def _flat(at: Sequence[Expr], sizes: Sequence[Expr]) -> Expr:
    """The flat offset of `at` in a volume of `sizes` (row-major)."""
    out: Expr = at[0]
    for e, n in zip(at[1:], sizes[1:]):
        out = out * n + e
    return out


@register(aten.max_pool3d_with_indices.default)
def lower_max_pool3d(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                     padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple:
    meta, idx_meta = ctx.out_meta()
    if not x.dtype.is_floating_point or len(x.size) not in (ND + 1, ND + 2):
        raise NotLowered("max_pool3d of a non-float tensor or one of other dims")
    k = _tuple(kernel_size, ND, ())
    s, p, d = _tuple(stride, ND, k), _tuple(padding, ND, (0,)), _tuple(dilation, ND, (1,))
    sizes = list(x.size[-ND:])
    size = [ir.sympify_size(n) for n in meta.shape]
    bounded = any(p) or ceil_mode  # else every tap is inside the input by the output size's formula
    dt = meta.dtype

    def taps(ops: Any, idx: Sequence[Expr]) -> list[tuple[Any, Expr, Any]]:
        """(value, flat input offset, inside the input or None when always) of each tap."""
        lead, outs = list(idx[:-ND]), list(idx[-ND:])
        found = []
        for t in itertools.product(*(range(kk) for kk in k)):
            at = [o * s_ - p_ + i * d_ for o, s_, p_, i, d_ in zip(outs, s, p, t, d)]
            v = load_as(ops, x, [*lead, *(_clamp_index(e, n) for e, n in zip(at, sizes))], dt, x.size)
            inside = None
            if bounded:
                inside = _inside_all(ops, at, sizes)
                v = ops.where(inside, v, ops.constant(float("-inf"), dt))
            found.append((v, _flat(at, sizes), inside))
        return found

    return max_pool_outputs(ctx, taps, size, meta, idx_meta, "indices")


@register(aten.max_pool3d_with_indices_backward.default)
def lower_max_pool3d_backward(ctx: Lowerer, grad: TensorValue, x: TensorValue, kernel_size: Sequence[int],
                              stride: Sequence[int], padding: Any, dilation: Any, ceil_mode: bool,
                              indices: TensorValue) -> TensorValue:
    meta = ctx.out_meta()
    if len(x.size) not in (ND + 1, ND + 2) or not meta.dtype.is_floating_point:
        raise NotLowered("max_pool3d backward of a non-float tensor or one of other dims")
    k = _tuple(kernel_size, ND, ())
    s, p, d = _tuple(stride, ND, k), _tuple(padding, ND, (0,)), _tuple(dilation, ND, (1,))
    if any(v != 1 for v in d):
        raise NotLowered("max_pool3d backward with dilation")
    if not ctx.triton_target(meta) and meta.dtype not in (torch.float32, torch.float64):
        raise NotLowered("16-bit max_pool3d backward on the CPU (ATen accumulates in the 16-bit type)")
    sizes, out_sizes = list(x.size[-ND:]), list(grad.size[-ND:])
    acc = torch.float64 if meta.dtype == torch.float64 else torch.float32

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        lead, ins = list(idx[:-ND]), list(idx[-ND:])
        me = ops.index_expr(_flat(ins, sizes), I64)
        total = ops.constant(0.0, acc)
        for outs, covers in windows_over(ops, ins, k, s, p, out_sizes):
            at = [*lead, *(_clamp_index(o, n) for o, n in zip(outs, out_sizes))]
            chose = ops.logical_and(covers, ops.eq(load_as(ops, indices, at, I64, indices.size), me))
            g = load_as(ops, grad, at, acc, grad.size)
            total = ops.add(total, ops.where(chose, g, ops.constant(0.0, acc)))
        return ops.to_dtype(total, meta.dtype)

    size = [ir.sympify_size(n) for n in meta.shape]
    return ctx.add_compute(body, size, meta.dtype, stride=ctx.out_stride(size))
