"""View lowerings: each returns a `TensorValue` whose loader maps the view's
index to its base's index (no copy, no step). cat and constant_pad_nd are
pointwise nodes that read their inputs at clamped indices (always in bounds)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import sympy
import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, FloorDiv, ModularIndexing, TensorValue, masked_where
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.pointwise import load_as
from fuselens.compiler.lowering.registry import LibraryCall, NotLowered, aten, out_size, overloads, register

ZERO = sympy.Integer(0)
# a cat computed in its readers' kernels selects its part at every element, at a cost that
# grows with the parts: past 8 (Inductor's max_pointwise_cat_inputs too) ATen's one copy of
# each part and a plain read cost less (DenseNet-121 inference's cats of up to 32 parts, H200)
MAX_POINTWISE_CAT_PARTS = 8


def view_of(x: TensorValue, size: Sequence[Expr], reindex: Callable[[Sequence[Expr]], Sequence[Expr]]) -> TensorValue:
    base = x.loader
    return TensorValue(list(size), x.dtype, lambda ops, idx: base(ops, list(reindex(idx))), x.source)


def _norm_dim(d: int, ndim: int) -> int:
    return d + max(ndim, 1) if d < 0 else d


@register(aten.alias.default, *overloads(aten, "detach"), aten.lift_fresh.default if hasattr(aten, "lift_fresh") else None)
def lower_alias(ctx: Lowerer, x: TensorValue, *a: Any) -> TensorValue:
    return x


@register(aten.permute.default)
def lower_permute(ctx: Lowerer, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    n = len(x.size)
    dims = [_norm_dim(d, n) for d in dims]
    size = [x.size[d] for d in dims]

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        out = [ZERO] * n
        for k, d in enumerate(dims):
            out[d] = idx[k]
        return out

    return view_of(x, size, reindex)


@register(*overloads(aten.expand, "default"))
def lower_expand(ctx: Lowerer, x: TensorValue, sizes: Any, implicit: bool = False) -> TensorValue:
    size = out_size(ctx)
    lead = len(size) - len(x.size)

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        return [ZERO if (s == 1 and size[lead + d] != 1) else idx[lead + d] for d, s in enumerate(x.size)]

    return view_of(x, size, reindex)


def _reshape_groups(src: list[Expr], dst: list[Expr]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of source and destination dims with equal products, so a
    reshape indexes each run on its own (simple index expressions)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi: Expr = sympy.Integer(1)
        pj: Expr = sympy.Integer(1)
        if i < len(src):
            gi.append(i); pi = pi * src[i]; i += 1
        if j < len(dst):
            gj.append(j); pj = pj * dst[j]; j += 1
        while not ir.same_expr(pi, pj):
            take_src = _divides(pi, pj)
            if take_src is None:  # undecidable symbolically: one group for the rest
                gi += list(range(i, len(src))); gj += list(range(j, len(dst)))
                i, j = len(src), len(dst)
                break
            if take_src and i < len(src):
                gi.append(i); pi = pi * src[i]; i += 1
            elif not take_src and j < len(dst):
                gj.append(j); pj = pj * dst[j]; j += 1
            else:
                gi += list(range(i, len(src))); gj += list(range(j, len(dst)))
                i, j = len(src), len(dst)
                break
        groups.append((gi, gj))
    return groups


def _divides(a: Expr, b: Expr) -> "bool | None":
    """True when a < b (a divides b: take more source dims), False when b < a, None if unknown."""
    if a.is_Integer and b.is_Integer:
        return int(a) < int(b)
    if sympy.fraction(sympy.cancel(b / a))[1] == 1:
        return True
    if sympy.fraction(sympy.cancel(a / b))[1] == 1:
        return False
    return None


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, *overloads(aten, "view_copy"))
def lower_view(ctx: Lowerer, x: TensorValue, sizes: Any) -> TensorValue:
    if isinstance(sizes, torch.dtype):
        raise NotLowered("view as another dtype")
    size = out_size(ctx)
    src = list(x.size)
    if ir.same_sizes(src, size):
        return x
    groups = _reshape_groups(src, size)

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        out = [ZERO] * len(src)
        for gi, gj in groups:
            flat: Expr = ZERO
            for j in gj:
                flat = flat * size[j] + idx[j]
            stride: Expr = sympy.Integer(1)
            for i in reversed(gi):
                out[i] = ZERO if src[i] == 1 else (
                    FloorDiv(flat, stride) if i == gi[0] else ModularIndexing(flat, stride, src[i]))
                stride = stride * src[i]
        return out

    return view_of(x, size, reindex)


@register(*overloads(aten.squeeze, "default", "dim", "dims"))
def lower_squeeze(ctx: Lowerer, x: TensorValue, dims: Any = None) -> TensorValue:
    return _unsqueeze_like(ctx, x)


@register(aten.unsqueeze.default)
def lower_unsqueeze(ctx: Lowerer, x: TensorValue, dim: int) -> TensorValue:
    return _unsqueeze_like(ctx, x)


def _unsqueeze_like(ctx: Lowerer, x: TensorValue) -> TensorValue:
    """squeeze/unsqueeze only add or drop size-1 dims: match the non-1 dims in order."""
    size = out_size(ctx)
    src_keep = [d for d, s in enumerate(x.size) if s != 1]
    dst_keep = [d for d, s in enumerate(size) if s != 1]
    if len(src_keep) != len(dst_keep):
        raise NotLowered("squeeze of a dim that is not 1")

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        out = [ZERO] * len(x.size)
        for s, d in zip(src_keep, dst_keep):
            out[s] = idx[d]
        return out

    return view_of(x, size, reindex)


def _dim_size(x: TensorValue, dim: int) -> Expr:
    return x.size[dim]


@register(aten.slice.Tensor)
def lower_slice(ctx: Lowerer, x: TensorValue, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> TensorValue:
    dim = _norm_dim(dim, len(x.size))
    size = out_size(ctx)
    s = _slice_start(start, x.size[dim])
    step = sympy.sympify(step)

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        out = list(idx)
        out[dim] = s + step * idx[dim]
        return out

    return view_of(x, size, reindex)


def _slice_start(start: Any, n: Expr) -> Expr:
    """A slice's first index as ATen normalizes it (negative from the end, clamped)."""
    s = sympy.sympify(0 if start is None else start)
    if s.is_Integer and int(s) < 0:
        s = n + s
        if n.is_Integer:
            s = sympy.Integer(max(int(s), 0))
    if s.is_Integer and n.is_Integer:
        s = sympy.Integer(min(int(s), int(n)))
    return s


@register(aten.slice_scatter.default)
def lower_slice_scatter(ctx: Lowerer, x: TensorValue, src: TensorValue, dim: int = 0, start: Any = None,
                        end: Any = None, step: int = 1) -> TensorValue:
    """`x` with `src` written over a slice of `dim` (a slice's backward: a rotary
    embedding's halves, Swin's patch merging `x[:, 0::2, 1::2]`): each element picks
    src inside the slice (on its step), else x. As ATen, it would copy x and then src
    (two kernels and a copy a slice)."""
    if not isinstance(src, TensorValue):
        raise NotLowered("slice_scatter of a scalar")
    if not (isinstance(step, int) and step >= 1):
        raise NotLowered("slice_scatter with a symbolic step")
    size = out_size(ctx)
    dim = _norm_dim(dim, len(size))
    s, length = _slice_start(start, size[dim]), src.size[dim]
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        rel = idx[dim] - s
        inner = list(idx)
        zero = ops.constant(0, torch.int64)
        inside = _inside(ops, rel, length * step, zero)
        if step == 1:
            inner[dim] = _branch_index(ops, inside, rel, length)
        else:
            within = _clamp_index(rel, length * step)
            inner[dim] = FloorDiv(within, step)
            on_step = ops.eq(ops.index_expr(ModularIndexing(within, 1, step), torch.int64), zero)
            inside = ops.logical_and(inside, on_step)
        return masked_where(ops, inside, lambda: load_as(ops, src, inner, dt, src.size),
                            lambda: load_as(ops, x, idx, dt, size))

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


@register(aten.as_strided_scatter.default)
def lower_as_strided_scatter(ctx: Lowerer, x: TensorValue, src: TensorValue, size: Sequence[Any],
                             stride: Sequence[Any], storage_offset: Any = None) -> TensorValue:
    """`x` (contiguous) with `src` written through the strided view (size, stride,
    offset) of its storage, for views whose dims nest without overlap (each stride
    at least the extent of the dims inside it): an element at flat position o is in
    the view when o - offset splits into in-range indices of those strides. The
    functionalized backward of a view's in-place update (Swin-T: a [2, 768] view of
    a [1536] gradient)."""
    meta = ctx.arg_meta(0)
    if meta is None or not meta.is_contiguous() or not isinstance(src, TensorValue):
        raise NotLowered("as_strided_scatter into a non-contiguous tensor")
    vsize = [ir.sympify_size(v) for v in size]
    vstride = [ir.sympify_size(v) for v in stride]
    off = ir.sympify_size(storage_offset or 0)
    if not all(v.is_Integer for v in [*vsize, *vstride, off]):
        raise NotLowered("as_strided_scatter with symbolic strides")
    dims = sorted((d for d in range(len(vsize)) if int(vsize[d]) > 1), key=lambda d: -int(vstride[d]))
    if any(int(vstride[d]) <= 0 for d in dims) or any(
            int(vstride[outer]) < int(vstride[inner]) * int(vsize[inner]) for outer, inner in zip(dims, dims[1:])):
        raise NotLowered("as_strided_scatter through an overlapping view")
    out = out_size(ctx)
    extent = 1 + sum((int(vsize[d]) - 1) * int(vstride[d]) for d in dims)
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        rel = ir.offset_of(idx, ir.contiguous_strides(out)) - off
        rest = _clamp_index(rel, sympy.Integer(extent))
        zero = ops.constant(0, torch.int64)
        hit = _inside(ops, rel, sympy.Integer(extent), zero)
        at = [ZERO] * len(vsize)
        for d in dims:  # outer to inner: the index along each stride, and what is left for the inner ones
            j = FloorDiv(rest, vstride[d])
            rest = rest - j * vstride[d]
            hit = ops.logical_and(hit, ops.lt(ops.index_expr(j, torch.int64), ops.constant(int(vsize[d]), torch.int64)))
            at[d] = _clamp_index(j, vsize[d])
        if rest != 0:  # the innermost stride is not 1: offsets between its steps are not in the view
            hit = ops.logical_and(hit, ops.eq(ops.index_expr(rest, torch.int64), zero))
        return masked_where(ops, hit, lambda: load_as(ops, src, at, dt, src.size), lambda: load_as(ops, x, idx, dt, out))

    return ctx.add_compute(body, out, dt, stride=ctx.out_stride(out))


@register(aten.flip.default)
def lower_flip(ctx: Lowerer, x: TensorValue, dims: Sequence[int]) -> TensorValue:
    """An index map (n - 1 - i on each flipped dim); where its result must exist as a
    tensor, ATen's flip makes it (a copy, as eager's)."""
    flipped = {_norm_dim(d, len(x.size)) for d in dims}

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        return [x.size[d] - 1 - i if d in flipped else i for d, i in enumerate(idx)]

    return view_of(x, list(x.size), reindex)


@register(aten.select.int)
def lower_select(ctx: Lowerer, x: TensorValue, dim: int, index: Any) -> TensorValue:
    dim = _norm_dim(dim, len(x.size))
    index = sympy.sympify(index)
    if index.is_Integer and int(index) < 0:
        index = x.size[dim] + index

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        return list(idx[:dim]) + [index] + list(idx[dim:])

    return view_of(x, out_size(ctx), reindex)


@register(aten.diagonal.default)
def lower_diagonal(ctx: Lowerer, x: TensorValue, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorValue:
    n = len(x.size)
    dim1, dim2 = _norm_dim(dim1, n), _norm_dim(dim2, n)
    rest = [d for d in range(n) if d not in (dim1, dim2)]

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        out = [ZERO] * n
        for k, d in enumerate(rest):
            out[d] = idx[k]
        k = idx[len(rest)]
        out[dim1] = k + max(-offset, 0)
        out[dim2] = k + max(offset, 0)
        return out

    return view_of(x, out_size(ctx), reindex)


@register(aten.as_strided.default)
def lower_as_strided(ctx: Lowerer, x: TensorValue, size: Any, stride: Any, storage_offset: Any = None) -> TensorValue:
    """A strided view of `x`'s storage. A value with no buffer of its own (a view, a computed
    tensor) whose eager layout is dense from its storage's start, in any order of its dims, is
    read at the element each storage offset holds in that layout, as long as the view stays
    within its elements: Longformer's overlapping chunks of its queries and keys (a view of
    the projection's output, heads first), which had stayed ATen's on a materialized copy."""
    st = [ir.sympify_size(s) for s in stride]
    off = ir.sympify_size(storage_offset or 0)
    if x.direct:
        name = x.source
        return TensorValue(out_size(ctx), x.dtype, lambda ops, idx: ops.load(name, ir.offset_of(idx, st, off)), name)
    meta = ctx.arg_meta(0)
    size, src = out_size(ctx), list(x.size)
    src_stride = [ir.sympify_size(t) for t in meta.stride()] if meta is not None else []
    if meta is None or not all(v.is_Integer for v in [*size, *st, off, *src, *src_stride]) or any(
            int(v) <= 0 for v in size) or any(int(t) < 0 for t in st):
        raise NotLowered("as_strided of a view with symbolic sizes, an empty dim or a negative stride")
    if not ir.dense_layout(src, src_stride, {}) or meta.storage_offset() != 0:
        raise NotLowered("as_strided of a view that is not dense from its storage's start")
    last = int(off) + sum((int(s) - 1) * int(t) for s, t in zip(size, st))
    if last >= int(ir.numel(src)):
        raise NotLowered("as_strided of a view reaching past its elements")
    dims = sorted((d for d in range(len(src)) if src[d] != 1), key=lambda d: -int(src_stride[d]))  # outermost first

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        flat = ir.offset_of(idx, st, off)
        out = [ZERO] * len(src)
        for k, d in enumerate(dims):
            out[d] = FloorDiv(flat, src_stride[d]) if k == 0 else ModularIndexing(flat, src_stride[d], src[d])
        return out

    return view_of(x, size, reindex)


def _split(ctx: Lowerer, x: TensorValue, sizes: Sequence[Any], dim: int) -> tuple:
    dim = _norm_dim(dim, len(x.size))
    outs = []
    start: Expr = ZERO
    for s in sizes:
        s = sympy.sympify(s)
        size = list(x.size)
        size[dim] = s

        def reindex(idx: Sequence[Expr], start: Expr = start) -> list[Expr]:
            out = list(idx)
            out[dim] = idx[dim] + start
            return out

        outs.append(view_of(x, size, reindex))
        start = start + s
    return tuple(outs)


@register(aten.split.Tensor)
def lower_split(ctx: Lowerer, x: TensorValue, split_size: Any, dim: int = 0) -> tuple:
    return _split(ctx, x, [ir.sympify_size(m.shape[_norm_dim(dim, len(x.size))]) for m in ctx.out_meta()], dim)


@register(aten.split_with_sizes.default)
def lower_split_with_sizes(ctx: Lowerer, x: TensorValue, sizes: Sequence[Any], dim: int = 0) -> tuple:
    return _split(ctx, x, sizes, dim)


@register(aten.unbind.int)
def lower_unbind(ctx: Lowerer, x: TensorValue, dim: int = 0) -> tuple:
    dim = _norm_dim(dim, len(x.size))
    if not x.size[dim].is_Integer:
        raise NotLowered("unbind over a dynamic dim")
    outs = []
    for i in range(int(x.size[dim])):
        size = x.size[:dim] + x.size[dim + 1:]
        outs.append(view_of(x, size, lambda idx, i=i: list(idx[:dim]) + [sympy.Integer(i)] + list(idx[dim:])))
    return tuple(outs)


@functools.lru_cache(maxsize=4096)
def _clamp_index(e: Expr, n: Expr) -> Expr:
    """`e` clamped into [0, n). Cached: a node's body is traced again by every scheduler
    question and by the code generator (a 6-layer Llama: 494 calls, 13 distinct). Built
    unevaluated: sympy's Min and Max compare their arguments through the assumptions
    system on construction, 30 ms for Max(d0 - 21, 0) (Swin-T's attention-mask slices:
    60 clamps, 1.4-2.7 s of a compile). What that comparison could drop is dropped here:
    the lower clamp of a sum of non-negative terms, both clamps of a number."""
    hi = n - 1
    if e.is_Integer and hi.is_Integer:
        return sympy.Integer(min(max(int(e), 0), int(hi)))
    lo = e if ir.nonnegative(e) else sympy.Max(ZERO, e, evaluate=False)
    return sympy.Min(hi, lo, evaluate=False) if hi.is_Integer else sympy.Min(lo, hi)


def _branch_index(ops: Any, cond: Any, e: Expr, n: Expr) -> Expr:
    """`e`, an index that the branch `masked_where(cond, ...)` takes only where `cond`
    keeps it in [0, n): as it is where `ops` masks that branch's loads by `cond`
    (Triton, a condition computed from indices), clamped where every lane reads (C++,
    the analyses, a condition read from data). A clamp hides the index's contiguity
    from Triton, which then loads element by element (DenseNet-121's channels-last
    cats, H200: 86 us a kernel for 13 us of traffic)."""
    return e if ir.masks_branch_loads(ops, cond) else _clamp_index(e, n)


@register(aten.cat.default)
def lower_cat(ctx: Lowerer, tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    size = out_size(ctx)
    dt = ctx.out_meta().dtype
    dim = _norm_dim(dim, len(size))
    parts = [t for t in tensors if not (len(t.size) == 1 and t.size[0] == 0) and t.size[dim] != 0]
    if not parts:
        raise NotLowered("cat of empty tensors")
    if len(parts) > MAX_POINTWISE_CAT_PARTS:
        raise LibraryCall(f"a cat of {len(parts)} parts: ATen copies each part once, where a kernel computing "
                          f"the cat would select among all {len(parts)} at every element")
    offsets: list[Expr] = []
    acc: Expr = ZERO
    for t in parts:
        offsets.append(acc)
        acc = acc + t.size[dim]

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        pos = idx[dim]
        at = ops.index_expr(pos, torch.int64)

        ends = {i: ops.lt(at, ops.index_expr(offsets[i] + parts[i].size[dim], torch.int64))
                for i in reversed(range(len(parts) - 1))}
        masked = all(ir.masks_branch_loads(ops, c) for c in ends.values())

        def part(i: int) -> Any:
            inner = list(idx)
            # one part (a cache's first update: a cat onto an empty tensor) is read where
            # the cat's element is, no clamp: the same positions, so its producer's loop
            # can store the cat too; so is each part where its branch's loads are masked
            rel = pos - offsets[i]
            inner[dim] = pos if len(parts) == 1 else rel if masked else _clamp_index(rel, parts[i].size[dim])
            return load_as(ops, parts[i], inner, dt, size)

        def pick(i: int) -> Any:
            """where(pos < end_i, part_i, pick(i + 1)): each part read only in its range."""
            if i == len(parts) - 1:
                return part(i)
            return masked_where(ops, ends[i], lambda: part(i), lambda: pick(i + 1))

        return pick(0)

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


@register(aten.constant_pad_nd.default)
def lower_constant_pad(ctx: Lowerer, x: TensorValue, pad: Sequence[Any], value: Any = 0) -> TensorValue:
    """Padding by pad[2k] before and pad[2k+1] after dim n-1-k. A negative amount
    crops (a padding's backward): a dim padded on neither side needs no test."""
    size = out_size(ctx)
    dt = ctx.out_meta().dtype
    n = len(size)
    before: dict[int, Expr] = {}
    tested: set[int] = set()
    for k in range(len(pad) // 2):
        b, a = sympy.sympify(pad[2 * k]), sympy.sympify(pad[2 * k + 1])
        before[n - 1 - k] = b
        if not (b.is_Integer and int(b) <= 0 and a.is_Integer and int(a) <= 0):
            tested.add(n - 1 - k)

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        inner = list(idx)
        conds = []
        for d, b in before.items():
            inner[d] = idx[d] - b
            if d in tested:
                conds.append(_inside(ops, inner[d], x.size[d], ops.constant(0, torch.int64)))
        if not conds:
            return load_as(ops, x, inner, dt, size)
        c = conds[0]
        for other in conds[1:]:
            c = ops.logical_and(c, other)
        for d in tested:
            inner[d] = _branch_index(ops, c, inner[d], x.size[d])
        return masked_where(ops, c, lambda: load_as(ops, x, inner, dt, size), lambda: ops.constant(value, dt))

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


@register(torch.ops.prims.broadcast_in_dim.default)
def lower_broadcast_in_dim(ctx: Lowerer, x: TensorValue, shape: Any, broadcast_dimensions: Sequence[int]) -> TensorValue:
    size = out_size(ctx)

    def reindex(idx: Sequence[Expr]) -> list[Expr]:
        return [ZERO if (x.size[k] == 1 and size[d] != 1) else idx[d] for k, d in enumerate(broadcast_dimensions)]

    return view_of(x, size, reindex)


def _inside(ops: Any, e: Expr, n: Expr, zero: Any) -> Any:
    iv = ops.index_expr(e, torch.int64)
    return ops.logical_and(ops.ge(iv, zero), ops.lt(iv, ops.index_expr(n, torch.int64)))


def _dense_stride(meta: torch.Tensor, size: Sequence[Expr], ctx: Lowerer) -> list[Expr]:
    st = [ir.sympify_size(s) for s in meta.stride()]
    return st if ir.dense_layout(size, st, ctx.graph.size_hints) else ir.contiguous_strides(size)
