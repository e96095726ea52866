"""Reads at indices held in a tensor: embedding, gather, advanced indexing
(`x[idx]`, `x[:, rows, cols]`) and index_select, as generated code.

An element's index along one dim is loaded from the index tensor and handed to the
data's loader as an `ir.Indirect` symbol (`ops.indirect`, clamped into the dim), so
a token embedding is read inside the kernel that adds the position embedding and
normalises the sum, and cross-entropy's gather of the target logit inside the loss
kernel, instead of each being an ATen kernel and a buffer of its own.

Eager raises on an index outside the dim; the generated kernel reads the nearest
row instead (it must not read outside the buffer, and cannot raise mid-kernel).
Indexing and index_select take negative indices from the end, as eager does.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, TensorValue
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.pointwise import load_as
from fuselens.compiler.lowering.registry import NotLowered, aten, out_size, register


@register(aten.embedding.default)
def lower_embedding(ctx: Lowerer, weight: TensorValue, indices: TensorValue, padding_idx: int = -1,
                    scale_grad_by_freq: bool = False, sparse: bool = False) -> TensorValue:
    """out[*i, *j] = weight[indices[*i], *j]."""
    if not isinstance(indices, TensorValue) or indices.dtype not in (torch.int32, torch.int64):
        raise NotLowered("embedding with indices that are not an integer tensor")
    size = out_size(ctx)
    k = len(indices.size)
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        row = ops.indirect(load_as(ops, indices, idx[:k], indices.dtype, indices.size), weight.size[0])
        return load_as(ops, weight, [row, *idx[k:]], dt, weight.size)

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


@register(aten.gather.default)
def lower_gather(ctx: Lowerer, x: TensorValue, dim: int, index: TensorValue, *, sparse_grad: bool = False) -> TensorValue:
    """out[i] = x[i with dim `dim` replaced by index[i]]."""
    if not isinstance(index, TensorValue) or not isinstance(x, TensorValue) or not x.size \
            or len(x.size) != len(index.size):
        raise NotLowered("gather of a 0-d tensor")
    size = out_size(ctx)
    d = dim % max(len(x.size), 1)
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        at = ops.indirect(load_as(ops, index, idx, index.dtype, index.size), x.size[d])
        return load_as(ops, x, [*idx[:d], at, *idx[d + 1:]], dt, x.size)

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


def _wrapped_index(ops: Any, t: TensorValue, idx: Sequence[Expr], shape: Sequence[Expr], dim_size: Expr) -> Expr:
    """Element `idx` of index tensor `t` broadcast to `shape`, a negative one counted
    from the end of a dim of `dim_size` (eager's x[-1]), as an indirect index."""
    v = load_as(ops, t, idx, torch.int64, shape)
    v = ops.where(ops.lt(v, ops.constant(0, torch.int64)), ops.add(v, ops.index_expr(dim_size, torch.int64)), v)
    return ops.indirect(v, dim_size)


@register(aten.index.Tensor)
def lower_index(ctx: Lowerer, x: TensorValue, indices: Sequence[Any]) -> TensorValue:
    """Advanced indexing: the index tensors broadcast together to one shape B; the
    result has B where the indexed dims were when they are adjacent, else B first,
    and x's other dims in order around it (numpy's rule)."""
    if not isinstance(x, TensorValue) or not x.size:
        raise NotLowered("indexing a 0-d tensor")
    tensors = list(indices)
    if any(t is not None and (not isinstance(t, TensorValue) or t.dtype not in (torch.int32, torch.int64))
           for t in tensors):
        raise NotLowered("indexing with a boolean mask (its result's size depends on the data)")
    at = [d for d, t in enumerate(tensors) if t is not None]
    if not at:
        raise NotLowered("indexing with no index tensor")
    size = out_size(ctx)
    nb = len(size) - (len(x.size) - len(at))
    adjacent = at == list(range(at[0], at[-1] + 1))
    start = at[0] if adjacent else 0
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        b = list(idx[start:start + nb])
        b_shape = size[start:start + nb]
        rest = iter([*idx[:start], *idx[start + nb:]])
        xi = [_wrapped_index(ops, tensors[d], b, b_shape, x.size[d]) if d < len(tensors) and tensors[d] is not None
              else next(rest) for d in range(len(x.size))]
        return load_as(ops, x, xi, dt, x.size)

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


@register(aten.index_select.default)
def lower_index_select(ctx: Lowerer, x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    """out[..., i, ...] = x[..., index[i], ...] along `dim`."""
    if not isinstance(x, TensorValue) or not isinstance(index, TensorValue) or not x.size \
            or index.dtype not in (torch.int32, torch.int64) or len(index.size) > 1:
        raise NotLowered("index_select of a 0-d tensor or with an index of more than one dim")
    size = out_size(ctx)
    d = dim % len(x.size)
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        i = [idx[d]] if index.size else []
        row = _wrapped_index(ops, index, i, index.size, x.size[d])
        return load_as(ops, x, [*idx[:d], row, *idx[d + 1:]], dt, x.size)

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


@register(aten.index_put.default)
def lower_index_put(ctx: Lowerer, x: TensorValue, indices: Sequence[Any], values: Any,
                    accumulate: bool = False) -> TensorValue:
    """`x[idx] = v` with a few positions along one dim: a static KV cache's `index_copy_`
    at the decoded position, an assignment to a few rows. Each element of the result
    compares its position along that dim with the indices and takes the value of the
    last that matches (ATen's order on the CPU), else x's: one pass, where ATen copies x
    and then writes into the copy. Accumulating ones (an embedding's backward) are
    graph_passes' `index_put_accumulate_as_index_add`; more positions than
    SCATTER_MAX_PER_LINE (a permutation's inverse) stay ATen's."""
    import sympy

    from fuselens.compiler.lowering.pointwise import SCATTER_MAX_PER_LINE

    if accumulate:
        raise NotLowered("index_put with accumulate=True")
    tensors = list(indices)
    at = [d for d, t in enumerate(tensors) if t is not None]
    if not isinstance(x, TensorValue) or len(at) != 1:
        raise NotLowered("index_put with other than one index tensor")
    p, t = at[0], tensors[at[0]]
    if isinstance(t, TensorValue) and t.dtype == torch.bool:
        return _put_through_mask(ctx, x, p, t, values)
    if not isinstance(t, TensorValue) or t.dtype not in (torch.int32, torch.int64) or len(t.size) != 1:
        raise NotLowered("index_put with a boolean mask or an index of other than one dim")
    k = t.size[0]
    if not k.is_Integer or int(k) > SCATTER_MAX_PER_LINE:
        raise NotLowered(f"index_put of more than {SCATTER_MAX_PER_LINE} positions")
    size = out_size(ctx)
    indexed = [*x.size[:p], k, *x.size[p + 1:]]  # x[idx]'s shape: values broadcast to it
    if isinstance(values, TensorValue) and len(values.size) > len(indexed):
        raise NotLowered("index_put whose values have more dims than what they replace")
    dt = ctx.out_meta().dtype
    i64 = torch.int64

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        out = load_as(ops, x, idx, dt, size)
        here = ops.index_expr(idx[p], i64)
        for j in range(int(k)):
            pos = load_as(ops, t, [sympy.Integer(j)], i64, [k])
            pos = ops.where(ops.lt(pos, ops.constant(0, i64)), ops.add(pos, ops.index_expr(x.size[p], i64)), pos)
            line = [sympy.Integer(j) if d == p else i for d, i in enumerate(idx)]
            out = ops.where(ops.eq(here, pos), load_as(ops, values, line, dt, indexed), out)
        return out

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))


def _put_through_mask(ctx: Lowerer, x: TensorValue, p: int, mask: TensorValue, values: Any) -> TensorValue:
    """`x[mask] = v` with one value (`t[t == 2] = big`, Longformer's global-attention mask) is
    `where(mask, v, x)`: the mask covers x's dims from p on, each element of x takes v where
    its mask element is set. Without it ATen copied x and wrote through the mask."""
    size = out_size(ctx)
    m = len(mask.size)
    if p + m > len(x.size) or any(not ir.same_expr(a, b) for a, b in zip(mask.size, x.size[p:p + m])):
        raise NotLowered("index_put through a boolean mask not shaped like the dims it indexes")
    if isinstance(values, TensorValue) and not all(ir.same_expr(v, 1) for v in values.size):
        raise NotLowered("index_put through a boolean mask of more than one value")
    dt = ctx.out_meta().dtype

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        hit = load_as(ops, mask, idx[p:p + m], torch.bool, mask.size)
        return ops.where(hit, load_as(ops, values, idx, dt, size), load_as(ops, x, idx, dt, size))

    return ctx.add_compute(body, size, dt, stride=ctx.out_stride(size))
