"""Random tensors computed in the kernels that read them (`random_ops.py` says how
and why): `fuselens::random` is a pointwise node of Philox numbers, its graph's
`fuselens::random_seeds` a library call (torch's generator draws the seeds)."""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr, TensorValue
from fuselens.compiler.lowering.lowerer import Lowerer
from fuselens.compiler.lowering.pointwise import load_as
from fuselens.compiler.lowering.registry import out_size, register
from fuselens.compiler.random_ops import RANDOM, SEEDS


@register(SEEDS)
def lower_seeds(ctx: Lowerer, count: int, device: Any) -> TensorValue:
    return ctx.extern("the graph's random seeds, drawn from torch's generator at each call")


@register(RANDOM)
def lower_random(ctx: Lowerer, seeds: TensorValue, index: int, size: Any, stride: Any, dtype: torch.dtype,
                 normal: bool) -> TensorValue:
    size = out_size(ctx)
    dense = ir.contiguous_strides(size)
    n = ir.numel(size)
    # the same numbers either way (a 64-bit offset's high word is 0 below 2^32): 32-bit is fewer operations
    small = n.is_Integer and int(n) < 2**31
    offset_dtype = torch.int32 if small else torch.int64
    at = [sympy.Integer(index)]

    def body(ops: Any, idx: Sequence[Expr]) -> Any:
        seed = load_as(ops, seeds, at, torch.int64, seeds.size)
        offset = ops.index_expr(ir.offset_of(idx, dense), offset_dtype)
        r = ops.randn(seed, offset) if normal else ops.rand(seed, offset)
        return r if dtype == torch.float32 else ops.to_dtype(r, dtype)

    return ctx.add_compute(body, size, dtype, stride=ctx.out_stride(size))
