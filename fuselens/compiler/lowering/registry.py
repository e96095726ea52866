"""The lowering table and the contract of a lowering function.

A lowering gets the `Lowerer` (for the output's fake tensor and to register
compute nodes) and the call's arguments with FX nodes replaced by lowered values
(`TensorValue`, a sympy expression for SymInts, or plain Python values). It
returns the lowered value(s) or raises `NotLowered(reason)`, in which case the
op runs through ATen. The op tables (pointwise.py, reductions.py, views.py)
fill `LOWERINGS` with `@register`; the walk (lowerer.py) reads it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr

aten = torch.ops.aten
prims = torch.ops.prims
LOWERINGS: dict[Any, Callable[..., Any]] = {}


class NotLowered(Exception):
    """Raised by a lowering that cannot handle this call; the node falls back to ATen."""


def register(*ops: Any) -> Callable:
    """Register the decorated function as the lowering of `ops` (an overload
    packet registers each of its overloads that has no lowering yet)."""

    def deco(fn: Callable) -> Callable:
        for op in ops:
            if op is None:
                continue
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS.setdefault(getattr(op, name), fn)
            else:
                LOWERINGS[op] = fn
        return fn

    return deco


def overloads(packet: Any, *names: str) -> list[Any]:
    """The named overloads of an op that exist in this torch version."""
    return [getattr(packet, n) for n in names if hasattr(packet, n)]


def out_size(ctx: Any) -> list[Expr]:
    """The output size of the call being lowered (from its fake tensor)."""
    return [ir.sympify_size(s) for s in ctx.out_meta().shape]
