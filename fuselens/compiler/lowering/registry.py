"""The lowering table and the contract of a lowering function.

A lowering gets the `Lowerer` (for the output's fake tensor and to register
compute nodes) and the call's arguments with FX nodes replaced by lowered values
(`TensorValue`, a sympy expression for SymInts, or plain Python values). It
returns the lowered value(s) or raises `NotLowered(reason)`, in which case the
op runs through ATen as a fallback (`LibraryCall(reason)`: as a library call,
chosen). The op tables (pointwise.py, reductions.py, views.py) fill `LOWERINGS`
with `@register`; the walk (lowerer.py) reads it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from fuselens.compiler import ir
from fuselens.compiler.ir import Expr

aten = torch.ops.aten
prims = torch.ops.prims
LOWERINGS: dict[Any, Callable[..., Any]] = {}
# lowerings of ops defined only once something imports their module (Dynamo emits Inductor's
# `prims::fma` for `addcmul_`/`addcdiv_`, defined by torch._inductor.inductor_prims): by name,
# so that lowering need not import it (1.2 s)
_BY_NAME: dict[str, Callable[..., Any]] = {}


class NotLowered(Exception):
    """Raised by a lowering that cannot handle this call; the node falls back to ATen."""


class LibraryCall(NotLowered):
    """Raised by a lowering that could generate this call but should not: ATen's kernel is
    the better one here. The node runs as a library call (kind "extern", as a matmul
    does), not as a fallback: nothing is missing, and no finding reports it."""


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


def register_by_name(name: str) -> Callable:
    """`register` for an op known by its qualified name ("prims::fma") alone."""

    def deco(fn: Callable) -> Callable:
        _BY_NAME[name] = fn
        return fn

    return deco


def lowering_of(target: Any) -> Any:
    """The lowering of an FX node's target, None if it has none."""
    fn = LOWERINGS.get(target)
    if fn is None and _BY_NAME and isinstance(target, torch._ops.OpOverload):
        fn = _BY_NAME.get(target.name())
        if fn is not None:
            LOWERINGS[target] = fn
    return fn


def overloads(packet: Any, *names: str) -> list[Any]:
    """The named overloads of an op that exist in this torch version."""
    return [getattr(packet, n) for n in names if hasattr(packet, n)]


def out_size(ctx: Any) -> list[Expr]:
    """The output size of the call being lowered (from its fake tensor)."""
    return [ir.sympify_size(s) for s in ctx.out_meta().shape]
