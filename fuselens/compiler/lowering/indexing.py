"""Reads at indices held in a tensor: embedding and gather, as generated code.

An element's index along one dim is loaded from the index tensor and handed to the
data's loader as an `ir.Indirect` symbol (`ops.indirect`, clamped into the dim), so
a token embedding is read inside the kernel that adds the position embedding and
normalises the sum, and cross-entropy's gather of the target logit inside the loss
kernel, instead of each being an ATen kernel and a buffer of its own.

Eager raises on an index outside the dim; the generated kernel reads the nearest
row instead (it must not read outside the buffer, and cannot raise mid-kernel).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

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
