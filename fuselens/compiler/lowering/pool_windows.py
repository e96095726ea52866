"""Pool windows: the arguments, bounds and windows the pool lowerings (avg_pool.py,
max_pool.py) share."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch

from fuselens.compiler.ir import Expr, FloorDiv
from fuselens.compiler.lowering.views import _inside

I64 = torch.int64


def pool_tuple(v: Any, nd: int, default: Sequence[int]) -> tuple[int, ...]:
    """An int-or-list pool argument as `nd` ints, as ATen reads it (one value for all dims)."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    v = v or list(default)
    return tuple(int(v[0]) for _ in range(nd)) if len(v) == 1 else tuple(int(a) for a in v)


def inside_all(ops: Any, at: Sequence[Expr], sizes: Sequence[Expr]) -> Any:
    """Whether index `at` lies inside `sizes` along every dim."""
    zero = ops.constant(0, I64)
    ok = None
    for e, n in zip(at, sizes):
        here = _inside(ops, e, n, zero)
        ok = here if ok is None else ops.logical_and(ok, here)
    return ok


def flat_offset(at: Sequence[Expr], sizes: Sequence[Expr]) -> Expr:
    """The flat offset of `at` in a plane or volume of `sizes` (row-major): a max pool's index."""
    out: Expr = at[0]
    for e, n in zip(at[1:], sizes[1:]):
        out = out * n + e
    return out


def windows_over(ops: Any, ins: Sequence[Expr], k: Sequence[int], s: Sequence[int], p: Sequence[int],
                 out_sizes: Sequence[Expr]) -> list[tuple[list[Expr], Any]]:
    """(output index, whether that window covers the element) of each window that may lie
    over input element `ins` (a pool's backward gathers from them), in ascending output
    order, the first dim outermost: the order in which ATen's kernels scatter. An undilated
    pool's windows over one element along a dim are at most ceil(k / s)."""
    found = []
    for back in itertools.product(*(reversed(range(-(-kk // s_))) for kk, s_ in zip(k, s))):
        outs = [FloorDiv(i + p_, s_) - b for i, p_, s_, b in zip(ins, p, s, back)]
        covers = inside_all(ops, outs, out_sizes)
        for i, o, p_, s_, k_ in zip(ins, outs, p, s, k):
            covers = ops.logical_and(covers, ops.lt(ops.index_expr(i + p_ - o * s_, I64), ops.constant(k_, I64)))
        found.append((outs, covers))
    return found
