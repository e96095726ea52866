"""Reduction lowerings (sum, mean, amax, var, var_mean, prod, any, all, argmax and
argmin, max and min with their indices) and the
library calls we keep as externs on purpose (mm, bmm, addmm, convolution, SDPA).

A reduction node reduces `rdims` of its input; its output keeps eager's sizes
(with or without keepdim). mean and var are several nodes (sum, then divide;
mean, then sum of squared deviations, then divide): the scheduler fuses them
back into one row pass, and its events say so.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional, Sequence

import sympy
import torch

from fuselens.compiler import ir
from fuselens.compiler import library_epilogues  # noqa: F401  (registers fuselens::conv2d_bias_relu)
from fuselens.compiler.ir import Expr, TensorValue
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.registry import NotLowered, aten, out_size, overloads, prims, register

ZERO = sympy.Integer(0)


def _dims(x: TensorValue, dims: Any) -> list[int]:
    n = len(x.size)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d + max(n, 1) if d < 0 else d for d in dims} & set(range(max(n, 1)))) if n else []


def acc_dtype_for(kind: str, dtype: torch.dtype) -> torch.dtype:
    """Accumulate float sums/products in double (torch's float32 sums are
    cascaded; a double accumulator matches them), integer ones in int64."""
    if kind in ("any", "all"):
        return torch.bool
    if kind in ("sum", "prod"):
        if dtype.is_floating_point:
            return torch.float64
        return torch.int64
    return dtype


def reduce(
    ctx: Lowerer,
    x: TensorValue,
    dims: Any,
    kind: str,
    *,
    size: Optional[Sequence[Expr]] = None,
    dtype: Optional[torch.dtype] = None,
    name: Optional[str] = None,
    in_dtype: Optional[torch.dtype] = None,
    map_fn: Any = None,
) -> TensorValue:
    """A reduction node over `dims` of `x` (map_fn(ops, value, index) transforms
    each element first). `size` defaults to the FX node's output sizes."""
    rdims = _dims(x, dims)
    osize = list(size) if size is not None else out_size(ctx)
    out_dtype = dtype or ctx.out_meta().dtype
    acc = acc_dtype_for(kind, in_dtype or out_dtype)
    if any(x.size[d] == 0 for d in rdims) and kind in ("max", "min"):
        raise NotLowered("max/min over an empty dim raises in eager")
    loader = x.loader
    src_dtype = x.dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        v = loader(ops, idx)
        if map_fn is not None:
            v = map_fn(ops, v, idx)
            return v
        return v if src_dtype == acc else ops.to_dtype(v, acc)

    unrolled = _unrolled(x.size, rdims, osize, kind, body, acc, out_dtype, cast=map_fn is not None)
    if unrolled is not None:
        reduced = ir.format_sizes([x.size[d] for d in rdims])
        return ctx.add_compute(unrolled, osize, out_dtype, name=name, unrolled=f"{kind} over {reduced}",
                               stride=ctx.out_stride(osize) if size is None else None)
    return ctx.add_compute(
        body, osize, out_dtype, name=name, reduction=kind, full_size=list(x.size), rdims=rdims, acc_dtype=acc,
        stride=ctx.out_stride(osize) if size is None else None,
    )


# A reduction over this many elements or fewer, along dims other than the last, is a
# pointwise node that combines them one after another (Inductor unrolls every reduction
# this small: its unroll_reductions_threshold). Its readers iterate over the kept dims,
# the last among them, and a pointwise node runs inside their loop, where a reduction over
# an outer dim was a kernel of its own: Mixtral's sum over each token's two experts, then
# its residual add and RMSNorm, two kernels where Inductor has one (0.12 ms a layer on the
# H200 against 0.01, its loop order then also wrong: codegen/triton.py `_order`). A short
# reduction along the last dim stays one: its readers spread it back over the row it
# reduced (a softmax over a router's 8 experts), and the row's kernel holds them all.
UNROLL_AT_MOST = 8
_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum", "any": "logical_or",
            "all": "logical_and"}


def _unrolled(full: Sequence[Expr], rdims: Sequence[int], osize: Sequence[Expr], kind: str, body: Any,
              acc: torch.dtype, out_dtype: torch.dtype, cast: bool) -> Any:
    """The pointwise body of a reduction over few elements (their count known at compile
    time), in the reduction's order and accumulation dtype (`cast`: `body`'s values are not
    in it yet); None where it stays a reduction."""
    reduced = [full[d] for d in rdims]
    if not rdims or len(full) - 1 in rdims or kind not in _COMBINE \
            or not all(sympy.sympify(s).is_Integer for s in reduced):
        return None
    if not 1 <= int(ir.numel(reduced)) <= UNROLL_AT_MOST:
        return None
    keepdim = len(osize) == len(full)
    if not keepdim and len(osize) != len(full) - len(rdims):
        return None
    kept = [d for d in range(len(full)) if d not in rdims]
    # the reduced index, last dim fastest: the order a reduction loop takes
    points = list(itertools.product(*(map(sympy.Integer, range(int(s))) for s in reduced)))
    combine = _COMBINE[kind]

    def unrolled_body(ops: Any, idx: Sequence[Expr]) -> Any:
        outer = [idx[d] for d in kept] if keepdim else list(idx)
        total = None
        for point in points:
            index: list[Expr] = [ZERO] * len(full)
            for d, i in zip(kept, outer):
                index[d] = i
            for d, i in zip(rdims, point):
                index[d] = i
            v = body(ops, index)
            if cast:
                v = ops.to_dtype(v, acc)
            total = v if total is None else getattr(ops, combine)(total, v)
        return total if acc == out_dtype else ops.to_dtype(total, out_dtype)

    return unrolled_body


@register(*overloads(aten.sum, "dim_IntList", "default"))
def lower_sum(ctx: Lowerer, x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    return reduce(ctx, x, dims, "sum")


@register(*overloads(aten.prod, "dim_int", "default"))
def lower_prod(ctx: Lowerer, x: TensorValue, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    return reduce(ctx, x, dim, "prod")


@register(*overloads(aten.amax, "default"), *overloads(aten.max, "default"))
def lower_amax(ctx: Lowerer, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce(ctx, x, dims, "max")


@register(*overloads(aten.amin, "default"), *overloads(aten.min, "default"))
def lower_amin(ctx: Lowerer, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce(ctx, x, dims, "min")


@register(*overloads(aten.any, "default", "dim", "dims"))
def lower_any(ctx: Lowerer, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce(ctx, x, dims, "any")


@register(*overloads(aten.all, "default", "dim", "dims"))
def lower_all(ctx: Lowerer, x: TensorValue, dims: Any = None, keepdim: bool = False) -> TensorValue:
    return reduce(ctx, x, dims, "all")


def _arg_reduce(ctx: Lowerer, x: TensorValue, dim: Any, kind: str, size: Sequence[Expr]) -> tuple:
    """(the largest (`kind` "max") or smallest values over `dim`, the index of the first of
    each) at the output `size`; None for `dim`: over all of `x`, as a row-major flat index.
    ATen's argmax/argmin and max/min with indices: a NaN counts as the extreme, the first
    one winning. Two reductions over the same row, fused by the scheduler as a softmax's
    are: the extreme value, then the least index holding it."""
    if x.dtype.is_complex:
        raise NotLowered(f"arg{kind} of a {x.dtype} tensor")
    n = len(x.size)
    if n == 0:
        raise NotLowered(f"arg{kind} of a 0-d tensor")
    rdims = list(range(n)) if dim is None else _dims(x, dim)
    if any(x.size[d] == 0 for d in rdims):
        raise NotLowered(f"arg{kind} over an empty dim raises in eager")
    # a bool's largest is any, its smallest all (cumprod's backward finds a row's first zero
    # with max over a mask)
    extreme = {"max": "any", "min": "all"}[kind] if x.dtype == torch.bool else kind
    best = reduce(ctx, x, rdims, extreme, size=size, dtype=x.dtype, name=ctx.fresh(f"{kind}_values"))
    bl = best.loader
    keepdim = len(size) == n  # the reduced dims stay as ones
    floating = x.dtype.is_floating_point
    count = _count(x, rdims)  # above every index: what a miss contributes to the min

    def flat(idx: Sequence[Expr]) -> Expr:
        out: Expr = ZERO
        for d in rdims:
            out = out * x.size[d] + idx[d]
        return out

    def pick(ops: Any, v: Any, idx: Sequence[Expr]) -> Any:
        row = ([ZERO if d in rdims else i for d, i in enumerate(idx)] if keepdim
               else [i for d, i in enumerate(idx) if d not in rdims])
        m = bl(ops, row)
        hit = ops.eq(v, m)
        if floating:
            hit = ops.logical_or(hit, ops.logical_and(ops.isnan(v), ops.isnan(m)))
        return ops.where(hit, ops.index_expr(flat(idx), torch.int64), ops.index_expr(count, torch.int64))

    return best, reduce(ctx, x, rdims, "min", size=size, dtype=torch.int64, in_dtype=torch.int64, map_fn=pick)


@register(aten.argmax.default)
def lower_argmax(ctx: Lowerer, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    return _arg_reduce(ctx, x, dim, "max", out_size(ctx))[1]


@register(aten.argmin.default)
def lower_argmin(ctx: Lowerer, x: TensorValue, dim: Any = None, keepdim: bool = False) -> TensorValue:
    return _arg_reduce(ctx, x, dim, "min", out_size(ctx))[1]


@register(aten.max.dim)
def lower_max_dim(ctx: Lowerer, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    return _arg_reduce(ctx, x, dim, "max", [ir.sympify_size(s) for s in ctx.out_meta()[0].shape])


@register(aten.min.dim)
def lower_min_dim(ctx: Lowerer, x: TensorValue, dim: int, keepdim: bool = False) -> tuple:
    return _arg_reduce(ctx, x, dim, "min", [ir.sympify_size(s) for s in ctx.out_meta()[0].shape])


def _count(x: TensorValue, rdims: Sequence[int]) -> Expr:
    return ir.numel([x.size[d] for d in rdims])


def _keep_size(x: TensorValue, rdims: Sequence[int]) -> list[Expr]:
    return [sympy.Integer(1) if d in rdims else s for d, s in enumerate(x.size)]


def _divide(ctx: Lowerer, total: TensorValue, denom: Any, size: Sequence[Expr], dtype: torch.dtype,
            name: Optional[str] = None, stride: Any = None) -> TensorValue:
    tl = total.loader
    tsize = total.size
    # a bfloat16/float16 mean or variance divides in float and rounds once, as eager does
    cdt = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        inner = [i for i, s in zip(idx, size) if s != 1]
        full = []
        it = iter(inner)
        for s in tsize:
            full.append(ZERO if s == 1 else next(it))
        t = tl(ops, full)
        t = t if total.dtype == cdt else ops.to_dtype(t, cdt)
        d = ops.index_expr(denom, cdt) if isinstance(denom, sympy.Expr) and not denom.is_Number else ops.constant(
            float(denom), cdt)
        return ops.truediv(t, d)

    return ctx.add_compute(body, size, dtype, name=name, stride=stride)


@register(*overloads(aten.mean, "dim", "default"))
def lower_mean(ctx: Lowerer, x: TensorValue, dims: Any = None, keepdim: bool = False, *, dtype: Any = None) -> TensorValue:
    out_dtype = ctx.out_meta().dtype
    if not out_dtype.is_floating_point:
        raise NotLowered("mean of an integer dtype")
    rdims = _dims(x, dims)
    # A float32 mean is a float32 sum divided, as eager's: the C++ target may then accumulate
    # it in float, a vector lane twice as wide as double (an RMSNorm of 4096 rows of 256 ran
    # 2.6x Inductor's time summing in double). Triton's float64 sums are float32 already.
    sum_dtype = torch.float32 if out_dtype == torch.float32 and not _demotes_float64(ctx) else torch.float64
    total = reduce(ctx, x, rdims, "sum", size=_keep_size(x, rdims), dtype=sum_dtype, in_dtype=out_dtype,
                   name=ctx.fresh("sum"))
    size = out_size(ctx)
    return _divide(ctx, total, _count(x, rdims), size, out_dtype, stride=ctx.out_stride(size))


def _var(ctx: Lowerer, x: TensorValue, dims: Any, correction: Any, size: Sequence[Expr], out_dtype: torch.dtype,
         want_mean: bool) -> tuple[TensorValue, Optional[TensorValue]]:
    if not out_dtype.is_floating_point:
        raise NotLowered("var of an integer dtype")
    rdims = _dims(x, dims)
    keep = _keep_size(x, rdims)
    n = _count(x, rdims)
    total = reduce(ctx, x, rdims, "sum", size=keep, dtype=torch.float64, in_dtype=out_dtype, name=ctx.fresh("sum"))
    src_dtype = x.dtype
    if src_dtype == torch.float32 and not _demotes_float64(ctx):
        # One pass: sum and sum of squares accumulate in double, so E[x^2] - E[x]^2 loses
        # nothing a float32 result can show (cancellation would need |mean|/std > ~1e4);
        # the row is read once instead of twice (layernorm: 2 passes, not 3).
        def sq(ops: Any, v: Any, idx: Sequence[Expr]) -> Any:
            v = ops.to_dtype(v, torch.float64)
            return ops.mul(v, v)

        sumsq = reduce(ctx, x, rdims, "sum", size=keep, dtype=torch.float64, in_dtype=out_dtype,
                       name=ctx.fresh("sumsq"), map_fn=sq)
        tl, ql = total.loader, sumsq.loader

        def ssd_body(ops: Any, idx: Sequence[Expr]) -> Any:
            t, q = tl(ops, idx), ql(ops, idx)
            d = ops.sub(q, ops.truediv(ops.mul(t, t), _count_value(ops, n)))
            return ops.maximum(d, ops.constant(0.0, torch.float64))

        ssd = ctx.add_compute(ssd_body, keep, torch.float64, name=ctx.fresh("ssd"))
    else:
        mean = _divide(ctx, total, n, keep, torch.float64, name=ctx.fresh("mean"))
        ml = mean.loader

        def sq_dev(ops: Any, v: Any, idx: Sequence[Expr]) -> Any:
            m = ml(ops, [ZERO if d in rdims else i for d, i in enumerate(idx)])
            v = v if src_dtype == torch.float64 else ops.to_dtype(v, torch.float64)
            dev = ops.sub(v, m)
            return ops.mul(dev, dev)

        ssd = reduce(ctx, x, rdims, "sum", size=keep, dtype=torch.float64, in_dtype=out_dtype,
                     name=ctx.fresh("ssd"), map_fn=sq_dev)
    corr = 1 if correction is None else correction
    denom = n - corr
    if isinstance(denom, sympy.Expr) and denom.is_Number:
        denom = max(float(denom), 0.0)
    var = _divide(ctx, ssd, denom, size, out_dtype, name=ctx.fresh("var") if want_mean else None,
                  stride=None if want_mean else ctx.out_stride(size))
    mean_out = _divide(ctx, total, n, size, out_dtype, name=ctx.fresh("mean")) if want_mean else None
    return var, mean_out


def _demotes_float64(ctx: Lowerer) -> bool:
    """Whether this graph's kernels are Triton's, whose float64 accumulators are
    float32 on the GPU: there E[x^2] - E[x]^2 cancels (layernorm of rows with mean
    1000 and std 1 was off by 0.6), so the variance takes the two-pass form; a
    persistent kernel keeps the row in registers, so the second pass reads nothing."""
    meta = ctx.out_meta()
    return ctx.triton_target(meta[0] if isinstance(meta, (tuple, list)) else meta)


def _count_value(ops: Any, n: Any) -> Any:
    if isinstance(n, sympy.Expr) and not n.is_Number:
        return ops.index_expr(n, torch.float64)
    return ops.constant(float(n), torch.float64)


@register(*overloads(aten.var, "correction"))
def lower_var(ctx: Lowerer, x: TensorValue, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> TensorValue:
    return _var(ctx, x, dims, correction, out_size(ctx), ctx.out_meta().dtype, False)[0]


@register(*overloads(aten.var_mean, "correction"))
def lower_var_mean(ctx: Lowerer, x: TensorValue, dims: Any = None, *, correction: Any = None, keepdim: bool = False) -> tuple:
    meta = ctx.out_meta()
    size = [ir.sympify_size(s) for s in meta[0].shape]
    var, mean = _var(ctx, x, dims, correction, size, meta[0].dtype, True)
    return var, mean


# -- library calls kept on purpose ---------------------------------------------
_EXTERN = [
    *overloads(aten.mm, "default"), *overloads(aten.bmm, "default"), *overloads(aten.addmm, "default"),
    *overloads(aten.baddbmm, "default"), *overloads(aten.convolution, "default"), *overloads(aten._addmm_activation, "default"),
    *overloads(aten.convolution_backward, "default"),
    *overloads(aten, "_scaled_dot_product_flash_attention_for_cpu"),
    *overloads(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"),
    *overloads(aten, "_scaled_dot_product_efficient_attention"),
    *overloads(aten, "_scaled_dot_product_attention_math"),
    # the CUDA attention kernels SDPA dispatches to, and their backwards: torch 2.11 picks cuDNN's
    # on the H100/H200 for GPT-2 and Llama, which was reported as an op "not lowered"
    *overloads(aten, "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
               "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention",
               "_scaled_dot_product_cudnn_attention_backward", "_scaled_dot_product_fused_attention_overrideable",
               "_scaled_dot_product_fused_attention_overrideable_backward", "_flash_attention_forward",
               "_flash_attention_backward", "_efficient_attention_forward", "_efficient_attention_backward"),
    # ATen's atomic accumulation: what graph_passes' `index_put_accumulate_as_index_add` chooses for
    # an embedding's gradient on the GPU (every Hugging Face model's training backward)
    *overloads(aten.index_add, "default"),
    # FFTs (pocketfft or MKL on the CPU, cuFFT on CUDA), as Inductor calls them too: FNet's token
    # mixing was reported as an op "not lowered"
    *overloads(aten, "_fft_c2c", "_fft_r2c", "_fft_c2r"),
    # a mixture-of-experts layer's experts in one grouped GEMM (CUTLASS), as Hugging Face calls it
    # on GPUs that have it
    *(overloads(aten._grouped_mm, "default") if hasattr(aten, "_grouped_mm") else []),
]
_EXTERN.append(torch.ops.fuselens.conv2d_bias_relu.default)
EXTERN_OPS = set()
for _p in _EXTERN:
    if isinstance(_p, torch._ops.OpOverloadPacket):
        for _n in _p.overloads():
            EXTERN_OPS.add(getattr(_p, _n))
    else:
        EXTERN_OPS.add(_p)


def _lower_extern(ctx: Lowerer, *args: Any, **kwargs: Any) -> Any:
    return ctx.extern(f"library call {ctx.current.target} (ATen's tuned kernel)")


_lower_extern.library_call = True  # type: ignore[attr-defined]  # any dtype ATen takes (the lowerer's check)


register(*EXTERN_OPS)(_lower_extern)


# -- prims that some decompositions (native_layer_norm's var_mean) emit ---------


@register(prims.var.default)
def lower_prims_var(ctx: Lowerer, x: TensorValue, dims: Any, correction: Any = 1, *, output_dtype: Any = None) -> TensorValue:
    return _var(ctx, x, dims, correction, out_size(ctx), ctx.out_meta().dtype, False)[0]


@register(prims.sum.default)
def lower_prims_sum(ctx: Lowerer, x: TensorValue, dims: Any, *, output_dtype: Any = None) -> TensorValue:
    return reduce(ctx, x, dims, "sum")


@register(prims.amax.default)
def lower_prims_amax(ctx: Lowerer, x: TensorValue, dims: Any) -> TensorValue:
    return reduce(ctx, x, dims, "max")


@register(prims.amin.default)
def lower_prims_amin(ctx: Lowerer, x: TensorValue, dims: Any) -> TensorValue:
    return reduce(ctx, x, dims, "min")


# a cumsum is a masked reduction (n adds for each of its elements, n the row's length) while
# that is at most this many adds; beyond, ATen's scan, which adds once per element (a top-p
# sampler's cumsum over a 50k vocabulary)
CUMSUM_MAX_ADDS = 1 << 24


@register(aten.cumsum.default)
def lower_cumsum(ctx: Lowerer, x: TensorValue, dim: int, *, dtype: Any = None) -> TensorValue:
    """cumsum along `dim` as a reduction over a new axis j of x[..., j, ...] where j <= i:
    RoBERTa's and OPT's position ids (a cumsum of the padding mask over the sequence)
    fuse with the mask and the offset around them instead of an ATen kernel between
    them. Sums in int64 or double, as reductions do (ATen's CPU scan accumulates floats
    in double too)."""
    return _masked_scan(ctx, x, dim, "sum")


@register(aten.cumprod.default)
def lower_cumprod(ctx: Lowerer, x: TensorValue, dim: int, *, dtype: Any = None) -> TensorValue:
    """cumprod as cumsum is lowered, a product over j <= i (a survival or discount
    factor along a sequence)."""
    return _masked_scan(ctx, x, dim, "prod")


def _masked_scan(ctx: Lowerer, x: TensorValue, dim: int, kind: str) -> TensorValue:
    """out[..., i, ...] = the `kind` reduction of x[..., j, ...] over j <= i, the other
    j's masked to the reduction's identity."""
    meta = ctx.out_meta()
    what = "cumsum" if kind == "sum" else "cumprod"
    n_dims = len(x.size)
    if n_dims == 0:
        raise NotLowered(f"{what} of a scalar")
    d = dim + n_dims if dim < 0 else dim
    n = x.size[d]
    numel = ir.numel(x.size)
    if not (numel.is_Integer and int(numel) * int(n) <= CUMSUM_MAX_ADDS):
        raise NotLowered(f"{what} of more than {CUMSUM_MAX_ADDS} steps as a masked reduction, or of symbolic "
                         "size (ATen's scan)")
    loader = x.loader
    full = list(x.size) + [n]
    identity = 0 if kind == "sum" else 1

    def masked(ops: Any, idx: Sequence[Expr]) -> Any:
        i, j = idx[d], idx[-1]
        at = list(idx[:-1])
        at[d] = j
        take = ops.le(ops.index_expr(j, torch.int64), ops.index_expr(i, torch.int64))
        v = loader(ops, at)
        return ops.where(take, v, ops.constant(identity, x.dtype))

    acc = acc_dtype_for(kind, meta.dtype)

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        v = masked(ops, idx)
        return v if x.dtype == acc else ops.to_dtype(v, acc)

    size = list(x.size)
    return ctx.add_compute(body, size, meta.dtype, name=ctx.current.name, reduction=kind, full_size=full,
                           rdims=[n_dims], acc_dtype=acc, stride=ctx.out_stride(size))
