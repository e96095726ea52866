"""Integer bounds of index expressions over loop variables of known ranges, and the
clamps and comparisons those bounds decide.

A cat's or a pad's lowering reads each part through a clamped index (`min(C - 1, c)`)
and selects the part by a comparison of the loop index with a constant (`c < C`). When a
kernel's loop is split at those constants (codegen/cpp.py), each piece runs over a range
where the comparison has one answer and the clamp is the identity: both fold away, and
the loads become contiguous again. Bounds are inclusive `(lo, hi)` pairs of ints; None
where an expression is not bounded by what is known (a size symbol, an indirect index).
"""

from __future__ import annotations

from typing import Optional

import sympy

from fuselens.compiler.ir import Expr, FloorDiv, ModularIndexing

Bounds = tuple[int, int]


def bounds(e: Expr, ranges: dict) -> Optional[Bounds]:
    """The least and greatest value of `e` with each symbol in `ranges` (symbol ->
    inclusive (lo, hi)) anywhere in its range."""
    if e.is_Integer:
        return int(e), int(e)
    if e.is_Symbol:
        return ranges.get(e)
    if isinstance(e, sympy.Add):
        lo = hi = 0
        for a in e.args:
            b = bounds(a, ranges)
            if b is None:
                return None
            lo, hi = lo + b[0], hi + b[1]
        return lo, hi
    if isinstance(e, sympy.Mul):
        out: Bounds = (1, 1)
        for a in e.args:
            b = bounds(a, ranges)
            if b is None:
                return None
            corners = [x * y for x in out for y in b]
            out = (min(corners), max(corners))
        return out
    if isinstance(e, (sympy.Min, sympy.Max)):
        bs = [bounds(a, ranges) for a in e.args]
        if any(b is None for b in bs):
            return None
        pick = min if isinstance(e, sympy.Min) else max
        return pick(b[0] for b in bs), pick(b[1] for b in bs)
    if isinstance(e, FloorDiv):
        b, d = bounds(e.args[0], ranges), bounds(e.args[1], ranges)
        if b is None or d is None or d[0] != d[1] or d[0] <= 0:
            return None
        return b[0] // d[0], b[1] // d[0]
    if isinstance(e, ModularIndexing):
        b = bounds(FloorDiv(e.args[0], e.args[1]), ranges)
        m = bounds(e.args[2], ranges)
        if b is None or m is None or m[0] != m[1] or m[0] <= 0:
            return None
        if b[0] >= 0 and b[0] // m[0] == b[1] // m[0]:  # within one period: no wrap
            return b[0] % m[0], b[1] % m[0]
        return 0, m[0] - 1
    return None


def fold_clamps(e: Expr, ranges: dict) -> Expr:
    """`e` without the arguments of each Min (Max) that the ranges show can never be the
    least (greatest): a clamp that cannot bind is gone."""
    if not e.args:
        return e
    args = tuple(fold_clamps(a, ranges) for a in e.args)
    if isinstance(e, (sympy.Min, sympy.Max)):
        bs = [bounds(a, ranges) for a in args]
        if all(b is not None for b in bs):
            # drop an argument another kept one never exceeds (Min) / never falls below (Max)
            lower = isinstance(e, sympy.Min)
            kept = list(range(len(args)))
            for i in range(len(args)):
                if any(j != i and (bs[j][1] <= bs[i][0] if lower else bs[j][0] >= bs[i][1]) for j in kept):
                    kept.remove(i)
            keep = list(dict.fromkeys(args[i] for i in kept))
            if len(keep) == 1:
                return keep[0]
            args = tuple(keep)
        return e.func(*args, evaluate=False)
    if args == e.args:
        return e
    return e.func(*args)


_DECIDE = {
    "lt": lambda lo, hi: True if hi < 0 else False if lo >= 0 else None,
    "le": lambda lo, hi: True if hi <= 0 else False if lo > 0 else None,
    "gt": lambda lo, hi: True if lo > 0 else False if hi <= 0 else None,
    "ge": lambda lo, hi: True if lo >= 0 else False if hi < 0 else None,
    "eq": lambda lo, hi: True if lo == hi == 0 else False if lo > 0 or hi < 0 else None,
    "ne": lambda lo, hi: False if lo == hi == 0 else True if lo > 0 or hi < 0 else None,
}


def decide(op: str, a: Expr, b: Expr, ranges: dict) -> Optional[bool]:
    """`a <op> b` (op: lt, le, gt, ge, eq, ne) where the ranges decide it, else None."""
    d = bounds(sympy.expand(a - b), ranges)
    return None if d is None else _DECIDE[op](*d)


def flip_point(op: str, a: Expr, b: Expr, var: sympy.Symbol) -> Optional[int]:
    """The value of `var` at which `a <op> b` changes its answer, where `a - b` is
    `±var + k` (the comparisons a cat or a pad selects its part by), else None."""
    d = sympy.expand(a - b)
    c = d.coeff(var)
    k = d - c * var
    if c not in (1, -1) or not k.is_Integer:
        return None
    at = int(-k * c)  # where d is 0
    for cand in (at, at + 1):
        before = _DECIDE[op](*((c * (cand - 1) + int(k),) * 2))
        after = _DECIDE[op](*((c * cand + int(k),) * 2))
        if before != after:
            return cand
    return None
