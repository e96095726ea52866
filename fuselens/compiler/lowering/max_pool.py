"""Max pools as generated kernels: max_pool2d_with_indices (a ResNet stem's pool, an ATen
kernel between two generated ones, forward and backward), max_pool3d_with_indices (video and
volume networks) and their backwards.

The forwards are ATen's: each output is the max of its window's taps inside the input, taken
in row-major order, a later tap winning only when greater or NaN; its index is the winner's
flat offset in the input plane or volume. A 2-d training forward saves each winner's place
in its window as int8 instead (entry.py decomposes it so, as Inductor does). The backwards
gather, for each input element, the output gradients of the windows that chose it, summed
in float from zero in ascending output order, as ATen's kernels scatter them: a gather
fuses with the ReLU and BatchNorm gradients that read it.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Callable, Sequence

import sympy
import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, TensorValue
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.pointwise import load_as
from fuselens.compiler.lowering.pool_windows import flat_offset, inside_all, pool_tuple, windows_over
from fuselens.compiler.lowering.registry import NotLowered, aten, register
from fuselens.compiler.lowering.views import _clamp_index, _dense_stride, _inside

try:  # Inductor's prims for a max pool that saves int8 window places (entry.py decomposes to them)
    import torch._inductor.inductor_prims  # noqa: F401
except ImportError:  # pragma: no cover - a torch without them keeps int64 indices
    pass
POOL_WITH_OFFSETS = getattr(getattr(torch.ops.prims, "_low_memory_max_pool_with_offsets", None), "default", None)
POOL_OFFSETS_TO_INDICES = getattr(getattr(torch.ops.prims, "_low_memory_max_pool_offsets_to_indices", None),
                                  "default", None)


def _pair(v: Any, default: Sequence[int]) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    v = v or list(default)
    return (int(v[0]), int(v[-1]))


def pool2d_args(kernel_size: Any, stride: Any, padding: Any, dilation: Any) -> tuple[list[int], ...]:
    """A 2-D pool's kernel size, stride (default: the kernel size), padding and dilation,
    two ints each, as ATen reads its int-or-list arguments."""
    k = list(_pair(kernel_size, ()))
    return k, list(_pair(stride, k)), list(_pair(padding, (0,))), list(_pair(dilation, (1,)))


@register(aten.max_pool2d_with_indices.default)
def lower_max_pool2d(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                     padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple:
    """Each output element is the max of its window, read at clamped indices (taps
    outside the padded input count as -inf), like ATen's kernel: the first maximum
    wins and a NaN wins over everything. The indices (flat offsets into each input
    plane, what the backward reads) are a node of their own, made only when used."""
    return _max_pool2d(ctx, x, kernel_size, stride, padding, dilation, ceil_mode, offsets=False)


def lower_max_pool2d_with_offsets(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int],
                                  padding: Any, dilation: Any, ceil_mode: bool) -> tuple:
    """The pool of `aten.max_pool2d_with_indices` (entry.py decomposes it into this and
    `_low_memory_max_pool_offsets_to_indices`, as Inductor does) with the winning tap's
    place in its window (row-major, int8) for an index: what a training forward saves
    for the backward, an eighth of int64 indices (ResNet-50's stem: 6 MB, not 49)."""
    if len(kernel_size) != 2:
        raise NotLowered("a max pool over other than two dims")
    return _max_pool2d(ctx, x, kernel_size, stride, padding, dilation, ceil_mode, offsets=True)


def _max_pool2d(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int], padding: Any,
                dilation: Any, ceil_mode: bool, offsets: bool) -> tuple:
    meta, idx_meta = ctx.out_meta()
    if not x.dtype.is_floating_point or len(x.size) not in (3, 4):
        raise NotLowered("max_pool2d of a non-float or non-image tensor")
    (kh, kw), (ph, pw), (dh, dw) = _pair(kernel_size, ()), _pair(padding, (0,)), _pair(dilation, (1,))
    sh, sw = _pair(stride, (kh, kw))
    size = [ir.sympify_size(s) for s in meta.shape]
    h, w = x.size[-2], x.size[-1]
    bounded = ph > 0 or pw > 0 or ceil_mode  # else every tap is inside the input by the output size's formula
    dt = meta.dtype

    def taps(ops: Any, idx: Sequence[Expr]) -> list[tuple[Any, Expr, Any]]:
        """(value, index of the tap, inside the input or None when always) of each tap:
        its flat offset in the input plane, or its place in the window."""
        *lead, oh, ow = idx
        out = []
        for i in range(kh):
            for j in range(kw):
                ih, iw = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                v = load_as(ops, x, [*lead, _clamp_index(ih, h), _clamp_index(iw, w)], dt, x.size)
                inside = None
                if bounded:
                    zero = ops.constant(0, torch.int64)
                    inside = ops.logical_and(_inside(ops, ih, h, zero), _inside(ops, iw, w, zero))
                    v = ops.where(inside, v, ops.constant(float("-inf"), dt))
                out.append((v, sympy.Integer(i * kw + j) if offsets else ih * w + iw, inside))
        return out

    return max_pool_outputs(ctx, taps, size, meta, idx_meta, "offsets" if offsets else "indices")


def max_pool_outputs(ctx: Lowerer, taps: Callable, size: Sequence[Expr], meta: Any, idx_meta: Any,
                     idx_name: str) -> tuple:
    """A max pool's values and, when used, its indices, from `taps(ops, idx)`: (value, index
    of the tap, inside the input or None when always) of each tap of the window at `idx`
    (2-d and 3-d pools). ATen's rule: the max of the taps; the index of the first maximum in
    row-major order, a later tap winning only when greater or NaN, and a tap outside the
    input never winning over one inside."""
    def values(ops: Any, idx: Sequence[Expr]) -> Any:
        vs = taps(ops, idx)
        best = vs[0][0]
        for v, _, _ in vs[1:]:
            best = ops.maximum(best, v)
        return best

    idt = idx_meta.dtype

    def indices(ops: Any, idx: Sequence[Expr]) -> Any:
        vs = taps(ops, idx)
        best, at, have = vs[0][0], ops.index_expr(vs[0][1], idt), vs[0][2]
        for v, flat, inside in vs[1:]:
            take = ops.logical_or(ops.gt(v, best), ops.isnan(v))
            if inside is not None:
                take = ops.logical_and(inside, ops.logical_or(take, ops.logical_not(have)))
                have = ops.logical_or(have, inside)
            best = ops.where(take, v, best)
            at = ops.where(take, ops.index_expr(flat, idt), at)
        return at

    out = ctx.add_compute(values, size, meta.dtype, stride=_dense_stride(meta, size, ctx), name=ctx.current.name)
    used = {u.args[1] for u in ctx.current.users if u.target is operator.getitem}
    if 1 not in used:
        return out, None
    return out, ctx.add_compute(indices, size, idt, stride=_dense_stride(idx_meta, size, ctx),
                                name=ctx.fresh(idx_name))


def lower_max_pool_offsets_to_indices(ctx: Lowerer, offsets: TensorValue, kernel_size: Sequence[int],
                                      input_size: Sequence[Any], stride: Sequence[int], padding: Sequence[int],
                                      dilation: Sequence[int]) -> TensorValue:
    """A window place back to the flat input-plane index max_pool2d returns: pointwise,
    and inlined into the backward kernel that compares it (so the int64 indices are
    never stored)."""
    if len(kernel_size) != 2:
        raise NotLowered("a max pool over other than two dims")
    meta = ctx.out_meta()
    kw = int(kernel_size[1])
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride, ()), _pair(padding, (0,)), _pair(dilation, (1,))
    w = ir.sympify_size(input_size[-1])
    i64 = torch.int64

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        *_, oh, ow = idx
        o = load_as(ops, offsets, idx, i64, offsets.size)
        i = ops.floordiv(o, ops.constant(kw, i64))
        j = ops.sub(o, ops.mul(i, ops.constant(kw, i64)))
        ih = ops.add(ops.index_expr(oh * sh - ph, i64), ops.mul(i, ops.constant(dh, i64)))
        iw = ops.add(ops.index_expr(ow * sw - pw, i64), ops.mul(j, ops.constant(dw, i64)))
        return ops.add(ops.mul(ih, ops.index_expr(w, i64)), iw)

    size = [ir.sympify_size(s) for s in meta.shape]
    return ctx.add_compute(body, size, i64, stride=ctx.out_stride(size))


if POOL_WITH_OFFSETS is not None and POOL_OFFSETS_TO_INDICES is not None:
    register(POOL_WITH_OFFSETS)(lower_max_pool2d_with_offsets)
    register(POOL_OFFSETS_TO_INDICES)(lower_max_pool_offsets_to_indices)


@register(aten.max_pool3d_with_indices.default)
def lower_max_pool3d(ctx: Lowerer, x: TensorValue, kernel_size: Sequence[int], stride: Sequence[int] = (),
                     padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple:
    meta, idx_meta = ctx.out_meta()
    if not x.dtype.is_floating_point or len(x.size) not in (4, 5):
        raise NotLowered("max_pool3d of a non-float tensor or one of other dims")
    k = pool_tuple(kernel_size, 3, ())
    s, p, d = pool_tuple(stride, 3, k), pool_tuple(padding, 3, (0,)), pool_tuple(dilation, 3, (1,))
    sizes = list(x.size[-3:])
    size = [ir.sympify_size(n) for n in meta.shape]
    bounded = any(p) or ceil_mode  # else every tap is inside the input by the output size's formula
    dt = meta.dtype

    def taps(ops: Any, idx: Sequence[Expr]) -> list[tuple[Any, Expr, Any]]:
        """(value, flat input offset, inside the input or None when always) of each tap."""
        lead, outs = list(idx[:-3]), list(idx[-3:])
        found = []
        for t in itertools.product(*(range(kk) for kk in k)):
            at = [o * s_ - p_ + i * d_ for o, s_, p_, i, d_ in zip(outs, s, p, t, d)]
            v = load_as(ops, x, [*lead, *(_clamp_index(e, n) for e, n in zip(at, sizes))], dt, x.size)
            inside = None
            if bounded:
                inside = inside_all(ops, at, sizes)
                v = ops.where(inside, v, ops.constant(float("-inf"), dt))
            found.append((v, flat_offset(at, sizes), inside))
        return found

    return max_pool_outputs(ctx, taps, size, meta, idx_meta, "indices")


def _max_pool_backward(ctx: Lowerer, nd: int, grad: TensorValue, x: TensorValue, kernel_size: Any, stride: Any,
                       padding: Any, dilation: Any, indices: TensorValue) -> TensorValue:
    """Each input element's gradient gathers the output gradients of the windows that chose
    it (their index is its flat offset): a stride-2 3x3 pool has at most 2x2 such windows."""
    meta = ctx.out_meta()
    what = f"max_pool{nd}d backward"
    if len(x.size) not in (nd + 1, nd + 2) or not meta.dtype.is_floating_point:
        raise NotLowered(f"{what} of a non-float tensor or one of other dims")
    k = pool_tuple(kernel_size, nd, ())
    s, p, d = pool_tuple(stride, nd, k), pool_tuple(padding, nd, (0,)), pool_tuple(dilation, nd, (1,))
    if any(v != 1 for v in d):
        raise NotLowered(f"{what} with dilation")
    sizes, out_sizes = list(x.size[-nd:]), list(grad.size[-nd:])
    acc = torch.float64 if meta.dtype == torch.float64 else torch.float32

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        lead, ins = list(idx[:-nd]), list(idx[-nd:])
        me = ops.index_expr(flat_offset(ins, sizes), torch.int64)
        total = ops.constant(0.0, acc)
        for outs, covers in windows_over(ops, ins, k, s, p, out_sizes):
            at = [*lead, *(_clamp_index(o, n) for o, n in zip(outs, out_sizes))]
            chose = ops.logical_and(covers, ops.eq(load_as(ops, indices, at, torch.int64, indices.size), me))
            g = load_as(ops, grad, at, acc, grad.size)
            total = ops.add(total, ops.where(chose, g, ops.constant(0.0, acc)))
        return ops.to_dtype(total, meta.dtype)

    size = [ir.sympify_size(n) for n in meta.shape]
    return ctx.add_compute(body, size, meta.dtype, stride=ctx.out_stride(size))


@register(aten.max_pool2d_with_indices_backward.default)
def lower_max_pool2d_backward(ctx: Lowerer, grad: TensorValue, x: TensorValue, kernel_size: Sequence[int],
                              stride: Sequence[int], padding: Any, dilation: Any, ceil_mode: bool,
                              indices: TensorValue) -> TensorValue:
    return _max_pool_backward(ctx, 2, grad, x, kernel_size, stride, padding, dilation, indices)


@register(aten.max_pool3d_with_indices_backward.default)
def lower_max_pool3d_backward(ctx: Lowerer, grad: TensorValue, x: TensorValue, kernel_size: Sequence[int],
                              stride: Sequence[int], padding: Any, dilation: Any, ceil_mode: bool,
                              indices: TensorValue) -> TensorValue:
    return _max_pool_backward(ctx, 3, grad, x, kernel_size, stride, padding, dilation, indices)
