"""Pointwise lowerings (unary and binary math, comparisons, where, casts, fills,
iota/arange) and the broadcasting and type-promotion helpers the other op tables
share. The contract of a lowering is in registry.py."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import sympy
import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, TensorValue, masked_where
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.registry import (NotLowered, aten, out_size, overloads, prims, register,
                                                  register_by_name)

try:
    from torch.utils._sympy.functions import ToFloat as _ToFloat
except ImportError:  # pragma: no cover - torch without SymFloat printing functions
    _ToFloat = None


def broadcast(tv: TensorValue, size: Sequence[Expr]) -> Callable[[Any, Sequence[Expr]], Any]:
    """A loader of `tv` broadcast (numpy rules) to `size`."""
    lead = len(size) - len(tv.size)
    zero = sympy.Integer(0)
    # decided once: a body is evaluated again by every scheduling question and code generator
    spread = [s == 1 and size[lead + d] != 1 for d, s in enumerate(tv.size)]

    def load(ops: Any, idx: Sequence[Expr]) -> Any:
        return tv.loader(ops, [zero if b else idx[lead + d] for d, b in enumerate(spread)])

    return load


def load_as(ops: Any, v: Any, idx: Sequence[Expr], dtype: torch.dtype, size: Sequence[Expr]) -> Any:
    """Element `idx` of an operand (tensor, Python scalar, SymInt expression) as `dtype`."""
    if isinstance(v, TensorValue):
        x = broadcast(v, size)(ops, idx)
        return x if v.dtype == dtype else ops.to_dtype(x, dtype)
    if isinstance(v, sympy.Expr) and not v.is_Number:
        if _ToFloat is not None and isinstance(v, _ToFloat):  # sym_float(n), a mean's divisor: cast n itself
            v = v.args[0]
        return ops.index_expr(v, dtype)
    if isinstance(v, sympy.Expr):
        v = float(v) if v.is_Float else int(v)
    return ops.constant(v, dtype)


def _fake(v: Any) -> Any:
    if isinstance(v, TensorValue):
        return torch.empty([1] * len(v.size), dtype=v.dtype, device="meta")
    if isinstance(v, sympy.Expr):
        return 1.0 if v.is_Float else 1
    return v


def promote(a: Any, b: Any) -> torch.dtype:
    """torch's type promotion of two operands (0-dim tensors count as scalars)."""
    return torch.result_type(_fake(a), _fake(b))


def pointwise(
    ctx: Lowerer,
    args: Sequence[Any],
    fn: Callable[..., Any],
    *,
    compute_dtype: Optional[torch.dtype] = None,
    result_dtype: Optional[torch.dtype] = None,
) -> TensorValue:
    """Register a pointwise node computing fn(ops, *operands) at every output index.
    Operands are converted to `compute_dtype` (default: the output dtype); the result
    (of `result_dtype`, default compute_dtype) is converted to the output dtype."""
    meta = ctx.out_meta()
    size = out_size(ctx)
    out_dtype = meta.dtype
    cd = compute_dtype or out_dtype
    rd = result_dtype or cd

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        vals = [load_as(ops, a, idx, cd, size) for a in args]
        r = fn(ops, *vals)
        return r if rd == out_dtype else ops.to_dtype(r, out_dtype)

    return ctx.add_compute(body, size, out_dtype, stride=ctx.out_stride(size))


# -- unary -----------------------------------------------------------------
_UNARY = {
    "neg": "neg", "abs": "abs", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log",
    "log2": "log2", "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "reciprocal": "reciprocal", "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin",
    "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "erf": "erf", "erfc": "erfc", "sigmoid": "sigmoid",
    "floor": "floor", "ceil": "ceil", "trunc": "trunc", "sign": "sign", "relu": "relu",
    "lgamma": "lgamma", "frac": "frac", "bitwise_not": "bitwise_not", "square": "square",
}
for _aten_name, _op in _UNARY.items():
    def _make(op: str) -> Callable:
        def lower_unary(ctx: Lowerer, x: TensorValue) -> TensorValue:
            return pointwise(ctx, [x], lambda ops, a: getattr(ops, op)(a))
        return lower_unary
    if hasattr(aten, _aten_name):
        register(*overloads(getattr(aten, _aten_name), "default"))(_make(_op))
register(aten.round.default)(lambda ctx, x: pointwise(ctx, [x], lambda ops, a: ops.round(a)))

for _aten_name, _op in {"isnan": "isnan", "isinf": "isinf", "signbit": "signbit", "logical_not": "logical_not"}.items():
    def _make_pred(op: str) -> Callable:
        def lower_pred(ctx: Lowerer, x: TensorValue) -> TensorValue:
            cd = torch.bool if op == "logical_not" else x.dtype
            return pointwise(ctx, [x], lambda ops, a: getattr(ops, op)(a), compute_dtype=cd, result_dtype=torch.bool)
        return lower_pred
    register(*overloads(getattr(aten, _aten_name), "default"))(_make_pred(_op))


# -- binary ----------------------------------------------------------------
def _binary(op: str) -> Callable:
    def lower_binary(ctx: Lowerer, a: Any, b: Any, alpha: Any = None) -> TensorValue:
        if alpha is not None and alpha != 1:
            return pointwise(ctx, [a, b, alpha], lambda ops, x, y, k: getattr(ops, op)(x, ops.mul(y, k)))
        return pointwise(ctx, [a, b], lambda ops, x, y: getattr(ops, op)(x, y))
    return lower_binary


for _names, _op in [
    (("add",), "add"), (("sub",), "sub"), (("mul",), "mul"), (("maximum",), "maximum"),
    (("minimum",), "minimum"), (("fmax",), "fmax"), (("fmin",), "fmin"), (("atan2",), "atan2"),
    (("hypot",), "hypot"), (("copysign",), "copysign"), (("fmod",), "fmod"),
    (("remainder",), "remainder"),
    (("bitwise_and",), "bitwise_and"), (("bitwise_or",), "bitwise_or"), (("bitwise_xor",), "bitwise_xor"),
    (("bitwise_left_shift", "__lshift__"), "lshift"), (("bitwise_right_shift", "__rshift__"), "rshift"),
]:
    for _n in _names:
        register(*overloads(getattr(aten, _n), "default", "Tensor", "Scalar", "Tensor_Scalar", "Scalar_Tensor"))(_binary(_op))


@register(*overloads(aten.pow, "Tensor_Tensor", "Tensor_Scalar", "Scalar"))
def lower_pow(ctx: Lowerer, a: Any, b: Any) -> TensorValue:
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        if b == 2:
            return pointwise(ctx, [a], lambda ops, x: ops.mul(x, x))
        if b == 3:  # ATen's CPU kernel multiplies too; a libm pow call keeps a C++ loop scalar (GPT-2's GELU)
            return pointwise(ctx, [a], lambda ops, x: ops.mul(ops.mul(x, x), x))
        if b == 1:
            return pointwise(ctx, [a], lambda ops, x: x)
        if b == 0.5 and ctx.out_meta().dtype.is_floating_point:
            return pointwise(ctx, [a], lambda ops, x: ops.sqrt(x))
    return pointwise(ctx, [a, b], lambda ops, x, y: ops.pow(x, y))


@register(*overloads(aten.div, "Tensor", "Scalar"))
def lower_div(ctx: Lowerer, a: Any, b: Any) -> TensorValue:
    return pointwise(ctx, [a, b], lambda ops, x, y: ops.truediv(x, y))


@register(*overloads(aten.div, "Tensor_mode", "Scalar_mode"))
def lower_div_mode(ctx: Lowerer, a: Any, b: Any, rounding_mode: Optional[str] = None) -> TensorValue:
    op = {None: "truediv", "floor": "floordiv", "trunc": "truncdiv"}[rounding_mode]
    return pointwise(ctx, [a, b], lambda ops, x, y: getattr(ops, op)(x, y))


@register(*overloads(aten.floor_divide, "default", "Scalar"))
def lower_floor_divide(ctx: Lowerer, a: Any, b: Any) -> TensorValue:
    return pointwise(ctx, [a, b], lambda ops, x, y: ops.floordiv(x, y))


def _compare(op: str) -> Callable:
    def lower_compare(ctx: Lowerer, a: Any, b: Any) -> TensorValue:
        return pointwise(ctx, [a, b], lambda ops, x, y: getattr(ops, op)(x, y),
                         compute_dtype=promote(a, b), result_dtype=torch.bool)
    return lower_compare


for _op in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(*overloads(getattr(aten, _op), "Tensor", "Scalar"))(_compare(_op))

for _op in ("logical_and", "logical_or", "logical_xor"):
    def _make_logical(op: str) -> Callable:
        def lower_logical(ctx: Lowerer, a: Any, b: Any) -> TensorValue:
            return pointwise(ctx, [a, b], lambda ops, x, y: getattr(ops, op)(x, y),
                             compute_dtype=torch.bool, result_dtype=torch.bool)
        return lower_logical
    register(*overloads(getattr(aten, _op), "default"))(_make_logical(_op))


def lower_nextafter(ctx: Lowerer, a: Any, b: Any) -> TensorValue:
    # kernels hold 16-bit floats as float32, whose neighbour rounds back to the value
    # itself: bfloat16/float16 step in their own bits, in ATen
    if ctx.out_meta().dtype not in (torch.float32, torch.float64):
        raise NotLowered(f"nextafter of {ctx.out_meta().dtype} (kernels compute 16-bit floats in float32)")
    return pointwise(ctx, [a, b], lambda ops, x, y: ops.nextafter(x, y))


register(*overloads(aten.nextafter, "default"))(lower_nextafter)
# prims twins of the ATen pointwise ops (decompositions emit some of them)
for _name in ("add", "sub", "mul", "maximum", "minimum", "atan2", "fmod", "remainder", "bitwise_and",
              "bitwise_or", "bitwise_xor", "hypot", "nextafter", "copysign", "fmax", "fmin"):
    if hasattr(prims, _name):
        register(getattr(prims, _name).default)(
            lower_nextafter if _name == "nextafter" else _binary({"fmod": "fmod"}.get(_name, _name)))
for _name in _UNARY:
    if hasattr(prims, _name) and _name not in ("relu",):
        register(getattr(prims, _name).default)(
            (lambda op: lambda ctx, x: pointwise(ctx, [x], lambda ops, a: getattr(ops, op)(a)))(_UNARY[_name]))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    if hasattr(prims, _name):
        register(getattr(prims, _name).default)(_compare(_name))


@register_by_name("prims::fma")
def lower_fma(ctx: Lowerer, a: Any, b: Any, c: Any) -> TensorValue:
    """Inductor's fused multiply-add, which Dynamo emits for `addcmul_`, `addcdiv_` and `add_` with
    a tensor alpha: every compiled Adam/AdamW step (torch 2.13). ATen runs it as `(a * b) + c`."""
    return pointwise(ctx, [a, b, c], lambda ops, x, y, z: ops.add(ops.mul(x, y), z))


@register(prims.div.default)
def lower_prims_div(ctx: Lowerer, a: Any, b: Any) -> TensorValue:
    op = "truediv" if ctx.out_meta().dtype.is_floating_point else "truncdiv"
    return pointwise(ctx, [a, b], lambda ops, x, y: getattr(ops, op)(x, y))


@register(*overloads(aten.where, "self", "ScalarSelf", "ScalarOther", "Scalar"))
def lower_where(ctx: Lowerer, cond: Any, a: Any, b: Any) -> TensorValue:
    size = out_size(ctx)
    out_dtype = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        c = load_as(ops, cond, idx, torch.bool, size)
        return masked_where(ops, c, lambda: load_as(ops, a, idx, out_dtype, size),
                            lambda: load_as(ops, b, idx, out_dtype, size))

    return ctx.add_compute(body, size, out_dtype, stride=ctx.out_stride(size))


@register(*overloads(aten.masked_fill, "Scalar", "Tensor"))
def lower_masked_fill(ctx: Lowerer, x: Any, mask: Any, value: Any) -> TensorValue:
    size = out_size(ctx)
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        return ops.where(load_as(ops, mask, idx, torch.bool, size), load_as(ops, value, idx, dt, size),
                         load_as(ops, x, idx, dt, size))

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


@register(*overloads(aten.clamp, "default", "Tensor"), *overloads(aten.clamp_min, "default", "Tensor"),
          *overloads(aten.clamp_max, "default", "Tensor"))
def lower_clamp(ctx: Lowerer, x: Any, lo: Any = None, hi: Any = None) -> TensorValue:
    target = ctx.current.target
    if target in overloads(aten.clamp_max, "default", "Tensor"):
        lo, hi = None, lo
    bounds = [v for v in (lo, hi) if v is not None]

    def fn(ops: Any, v: Any, *bs: Any) -> Any:
        it = iter(bs)
        if lo is not None:
            v = ops.maximum(v, next(it))
        if hi is not None:
            v = ops.minimum(v, next(it))
        return v

    return pointwise(ctx, [x, *bounds], fn)


# -- conversions, copies, constants -----------------------------------------
def _identity_pw(ctx: Lowerer, x: Any) -> TensorValue:
    return pointwise(ctx, [x], lambda ops, a: a)


@register(aten._to_copy.default)
def lower_to_copy(ctx: Lowerer, x: Any, **kw: Any) -> TensorValue:
    dev = kw.get("device")
    src = ctx.arg_meta(0)
    out = ctx.out_meta()
    if dev is not None and not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)
                                and src.device == out.device):
        # a copy between devices is ATen's; `.to(x.device, dtype)` on the same device (a loss
        # dividing by its token count) is only a conversion, fused like any other
        raise NotLowered("copy to another device")
    return _identity_pw(ctx, x)


register(aten.clone.default, *overloads(aten, "lift_fresh_copy"))(lambda ctx, x, **kw: _identity_pw(ctx, x))
register(prims.convert_element_type.default)(lambda ctx, x, dtype: _identity_pw(ctx, x))


@register(aten.copy.default)
def lower_copy(ctx: Lowerer, dst: Any, src: Any, non_blocking: bool = False) -> TensorValue:
    return _identity_pw(ctx, src)


@register(aten.copy_.default)
def lower_copy_into_input(ctx: Lowerer, dst: Any, src: Any, non_blocking: bool = False) -> TensorValue:
    """An input mutation AOTAutograd kept in the graph (BatchNorm's running stats, an
    optimizer's parameters): a node computing the new value, which the plan stores
    straight into the input when that is safe (plan.py `_mutate_inputs`)."""
    inputs = {i.name for i in ctx.graph.inputs}
    if not (isinstance(dst, TensorValue) and dst.direct and dst.source in inputs
            and ir.same_sizes(dst.strides or [], ctx.graph.buffers[dst.source].stride)):
        raise NotLowered("copy_ into a view of an input")
    size = list(dst.size)

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        return load_as(ops, src, idx, dst.dtype, size)

    value = ctx.add_compute(body, size, dst.dtype, stride=list(dst.strides or []))
    ctx.graph.input_mutations[value.source] = dst.source
    return value


def _fill(ctx: Lowerer, value: Any) -> TensorValue:
    if isinstance(value, TensorValue):
        raise NotLowered("fill with a tensor value")
    return pointwise(ctx, [value], lambda ops, v: v)


register(*overloads(aten.full, "default"))(lambda ctx, size, value, **kw: _fill(ctx, value))
register(*overloads(aten.full_like, "default"))(lambda ctx, x, value, **kw: _fill(ctx, value))
register(*overloads(aten.zeros_like, "default"))(lambda ctx, x, **kw: _fill(ctx, 0))
register(*overloads(aten.ones_like, "default"))(lambda ctx, x, **kw: _fill(ctx, 1))
register(*overloads(aten.scalar_tensor, "default"))(lambda ctx, value, **kw: _fill(ctx, value))
register(*overloads(aten.fill, "Scalar"))(lambda ctx, x, value: _fill(ctx, value))
register(*overloads(aten.zeros, "default"))(lambda ctx, size, **kw: _fill(ctx, 0))
register(*overloads(aten.ones, "default"))(lambda ctx, size, **kw: _fill(ctx, 1))


@register(prims.iota.default)
def lower_iota(ctx: Lowerer, length: Any, *, start: Any, step: Any, dtype: Any, device: Any, requires_grad: bool) -> TensorValue:
    size = out_size(ctx)
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        return ops.index_expr(sympy.sympify(start) + sympy.sympify(step) * idx[0], dt)

    return ctx.add_compute(body, size, dt)


@register(*overloads(aten.arange, "start_step"))
def lower_arange(ctx: Lowerer, start: Any, end: Any, step: Any = 1, **kw: Any) -> TensorValue:
    """start + i * step. Floating results are computed in double and rounded once, as
    ATen's scalar arange does (its vectorized path adds the lanes of each vector in the
    output type, so eager's own values can sit an ulp away from these)."""
    if any(isinstance(v, TensorValue) for v in (start, end, step)):
        raise NotLowered("arange with tensor bounds")
    size = out_size(ctx)
    dt = ctx.out_meta().dtype
    if not dt.is_floating_point:
        # ATen converts a float start and step to the integer type first (toward zero): XLNet's
        # arange(klen, -qlen, -1.0) of int64 positions
        start, step = (int(v) if isinstance(v, float) else v for v in (start, step))
        if not all(isinstance(v, (int, sympy.Expr)) and not isinstance(v, bool) for v in (start, step)):
            raise NotLowered("integer arange with a non-number start or step")
        return lower_iota(ctx, None, start=start, step=step, dtype=dt, device=None, requires_grad=False)
    acc = torch.float64

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        i = ops.index_expr(idx[0], acc)
        v = ops.add(ops.mul(i, load_as(ops, step, idx, acc, size)), load_as(ops, start, idx, acc, size))
        return ops.to_dtype(v, dt)

    return ctx.add_compute(body, size, dt)


SCATTER_MAX_PER_LINE = 8  # indices per line compared at each output element (top-k routing: k of 1-8)


@register(*overloads(aten.scatter, "src", "value"))
def lower_scatter_few_per_line(ctx: Lowerer, x: TensorValue, dim: int, index: TensorValue, src: Any) -> TensorValue:
    """`scatter` with a few indices per line along `dim` (a cross-entropy backward puts
    -1/n at each row's target: `scatter(zeros, 1, target[:, None], g)`; top-k's backward,
    a mixture-of-experts router's, puts k gradients in each row) is a comparison in the
    output's own space: element c of a line takes src[j] where c == index[j], the last
    such j winning (ATen's order on the CPU; on CUDA ATen leaves it undefined), else
    self. Without it ATen copies the zeros (GPT-2's logits gradient: 0.4 GB) before
    scattering into them."""
    return _scatter_few_per_line(ctx, x, dim, index, src, accumulate=False)


@register(aten.scatter_add.default)
def lower_scatter_add_few_per_line(ctx: Lowerer, x: TensorValue, dim: int, index: TensorValue,
                                   src: TensorValue) -> TensorValue:
    """`scatter_add` with a few indices per line (a `gather`'s backward: DeepSeek-V3's router
    gathers each token's top-k expert scores): as `scatter`, each matching src added in
    index order, ATen's order on the CPU (on CUDA ATen adds them atomically, in no order)."""
    return _scatter_few_per_line(ctx, x, dim, index, src, accumulate=True)


def _scatter_few_per_line(ctx: Lowerer, x: TensorValue, dim: int, index: TensorValue, src: Any,
                          accumulate: bool) -> TensorValue:
    size = out_size(ctx)
    n = len(size)
    dim = dim + n if dim < 0 else dim
    if not isinstance(index, TensorValue) or len(index.size) != n or any(
            not ir.same_expr(index.size[d], size[d]) for d in range(n) if d != dim):
        raise NotLowered("scatter whose index is not shaped like self outside the scattered dim")
    per_line = index.size[dim]
    if not per_line.is_Integer or int(per_line) > SCATTER_MAX_PER_LINE:
        raise NotLowered(f"scatter with more than {SCATTER_MAX_PER_LINE} indices per line")
    if isinstance(src, TensorValue) and (len(src.size) != n or any(
            not ir.same_expr(src.size[d], index.size[d]) for d in range(n))):
        raise NotLowered("scatter whose src is not shaped like its index")
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        out = load_as(ops, x, idx, dt, size)
        at = ops.index_expr(idx[dim], torch.int64)
        for j in range(int(per_line)):
            line = [sympy.Integer(j) if d == dim else i for d, i in enumerate(idx)]
            hit = ops.eq(at, load_as(ops, index, line, torch.int64, index.size))
            new = load_as(ops, src, line, dt, index.size) if isinstance(src, TensorValue) else load_as(ops, src, idx, dt, size)
            out = ops.where(hit, ops.add(out, new) if accumulate else new, out)
        return out

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))
