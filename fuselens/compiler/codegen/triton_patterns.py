"""Patterns the Triton generator recognizes in a kernel group before emitting it.

Each compares node bodies as expression trees (`_SymOps`), so a pattern is found
by what the kernel computes, not by which ATen ops produced it:

* online softmax: a row max M of A, then the sum of exp(A - M) (one looped pass
  with a running max, `TritonKernel._online_pass`);
* Welford moments: row sums of A, then the sum of (A - S/n)^2 (one looped pass of
  per-lane Welford updates, `TritonKernel._welford_pass`);
* sin and cos of one value in one block (one shared range reduction, `_fl_sincos`).

and, on the printed lines, temporaries nothing reads (`drop_dead`).
"""

from __future__ import annotations

import re
from typing import Any, Optional, Protocol

import sympy
import torch

from fuselens.compiler.ir import ComputeNode


class TritonKernel(Protocol):
    """What the patterns read of the kernel being generated (triton.TritonKernel)."""

    g: Any  # the KernelGroup
    members: dict[str, ComputeNode]
    phase: dict[str, int]

    def rep_dtype(self, dtype: torch.dtype) -> torch.dtype: ...


def online_softmax_pairs(k: TritonKernel) -> dict[str, ComputeNode]:
    """{max node: sum node} where the sum reduces exp(A - max) and the max
    reduces A (the same expression), alone in consecutive passes."""
    g = k.g
    out: dict[str, ComputeNode] = {}
    reds = [n for n in g.nodes if n.is_reduction]
    for mx in reds:
        if mx.reduction != "max" or not mx.acc_dtype.is_floating_point:
            continue
        p = k.phase[mx.name]
        for sm in reds:
            if sm.reduction != "sum" or k.phase[sm.name] != p + 1:
                continue
            same_phase = [n for n in g.nodes if k.phase[n.name] == p + 1 and g.level(n) != "outer" and n is not sm
                          and (n.is_reduction or n.name in g.stores)]
            if same_phase or sum(1 for n in reds if k.phase[n.name] == p) != 1:
                continue
            if is_exp_of_shifted(sm, mx, k):
                out[mx.name] = sm
    return out


def welford_pairs(k: TritonKernel) -> dict[str, ComputeNode]:
    """{S: Q} for every S summing A over the row in the first pass (layernorm's
    decomposition sums the row twice, for the mean and inside the variance) and
    the Q of the next pass summing (A - M)^2, M a row constant of this kernel
    (the mean S/n); every reduction of the two passes in such a pair, nothing
    stored by either pass. Several A may each have theirs (two BatchNorms over
    ResNet's main and shortcut branches, horizontally fused). Welford's algorithm
    gives each pair in one pass over the rows, without the cancellation of
    E[A^2] - E[A]^2 in float32."""
    g = k.g
    reds = [n for n in g.nodes if n.is_reduction]
    if len(reds) < 2:
        return {}
    p0 = min(k.phase[n.name] for n in reds)
    sums = [n for n in reds if k.phase[n.name] == p0]
    qs = [n for n in reds if k.phase[n.name] != p0]
    if not qs or any(k.phase[q.name] != p0 + 1 for q in qs):
        return {}
    reps = {k.rep_dtype(n.acc_dtype) for n in reds}
    if any(n.reduction != "sum" for n in reds) or len(reps) != 1 or not reps.pop().is_floating_point:
        return {}
    if any(k.phase[n.name] in (p0, p0 + 1) and g.level(n) == "full" and n.name in g.stores for n in g.nodes):
        return {}  # a value stored in either pass needs that pass's own loop
    sym = _SymOps("", k)
    try:
        body = {n.name: _strip_casts(n.body(sym, g.full_index(n.full_size))) for n in sums}
    except Exception:  # noqa: BLE001 - any op the tracer does not model: no Welford pass
        return {}
    pairs: dict[str, ComputeNode] = {}
    for q in qs:
        mine = [s for s in sums if s.name not in pairs and deviation_center(k, s, q) is not None]
        if not mine:
            return {}
        for s in sums:  # the sums of the same A join it (the mean's sum and the variance's)
            if s.name not in pairs and body[s.name] == body[mine[0].name]:
                pairs[s.name] = q
    return pairs if len(pairs) == len(sums) else {}


def deviation_center(k: TritonKernel, s: ComputeNode, q: ComputeNode) -> Optional[ComputeNode]:
    """The row-constant node M when q's body is (A - M)^2 and A is s's body."""
    sym = _SymOps("", k)
    try:
        got = _strip_casts(q.body(sym, k.g.full_index(q.full_size)))
        want = _strip_casts(s.body(sym, k.g.full_index(s.full_size)))
    except Exception:  # noqa: BLE001 - any op the tracer does not model: no Welford pass
        return None
    if not (isinstance(got, tuple) and got[0] == "mul" and _strip_casts(got[1]) == _strip_casts(got[2])):
        return None
    dev = _strip_casts(got[1])
    if not (isinstance(dev, tuple) and dev[0] == "sub" and _strip_casts(dev[1]) == want):
        return None
    m = _strip_casts(dev[2])
    if not (isinstance(m, tuple) and m[0] == "load" and m[1] in k.members):
        return None
    node = k.members[m[1]]
    ok = k.g.level(node) == "outer" and k.phase[node.name] == k.phase[s.name]
    return node if ok else None


def is_exp_of_shifted(sm: ComputeNode, mx: ComputeNode, k: TritonKernel) -> bool:
    """Does `sm`'s body compute exp(A - M) where M loads `mx` and A is `mx`'s body?"""
    idx = k.g.full_index(sm.full_size)
    sym = _SymOps(mx.name, k)
    try:
        got = sm.body(sym, idx)
        want = mx.body(sym, k.g.full_index(mx.full_size))
    except Exception:  # noqa: BLE001 - any op the tracer does not model: no online pass
        return False
    got = _strip_casts(got)
    if not (isinstance(got, tuple) and got[0] == "exp"):
        return False
    inner = _strip_casts(got[1])
    if not (isinstance(inner, tuple) and inner[0] == "sub"):
        return False
    return _strip_casts(inner[1]) == _strip_casts(want) and _strip_casts(inner[2]) == ("load", mx.name)


def _strip_casts(v: Any) -> Any:
    while isinstance(v, tuple) and v[0] == "to_dtype":
        v = v[1]
    return v


class _SymOps:
    """An ops handler that builds expression trees (tuples) to compare bodies."""

    def __init__(self, max_name: str, k: TritonKernel) -> None:
        self.max_name = max_name
        self.k = k

    def load(self, name: str, index: Any) -> Any:
        if name == self.max_name:
            return ("load", name)
        m = self.k.members.get(name)
        if m is not None and self.k.g.level(m) == "full":  # fused producers are inlined, as in the kernel
            return m.body(self, self.k.g.own_index(m))
        return ("load", name, str(sympy.expand(sympy.sympify(index))))

    def constant(self, value: Any, dtype: torch.dtype) -> Any:
        return ("const", repr(value), str(dtype))

    def indirect(self, value: Any, size: Any) -> Any:
        from fuselens.compiler import ir

        return ir.Indirect(f"indirect_{abs(hash(str(value)))}", integer=True)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> Any:
        return ("index", str(expr), str(dtype))

    def to_dtype(self, x: Any, dtype: torch.dtype) -> Any:
        return ("to_dtype", x, str(dtype))

    def __getattr__(self, op: str) -> Any:
        if op.startswith("_"):
            raise AttributeError(op)
        return lambda *args: (op, *args)


_TRIG = re.compile(r"^(\s*)(tmp\d+) = tl\.(sin|cos)\((tmp\d+)\)$")


def share_sincos(lines: list[str]) -> list[str]:
    """sin and cos of float32 values take the prelude's `_fl_sincos`, not libdevice
    (cheaper to run and much cheaper to compile). sin(v) and cos(v) of the same value
    in one block become one `_fl_sincos(v)` (one range reduction): sin(x)^2 + cos(x)^2
    over 64M floats ran at 0.144 ms on an H200 against 0.130 for sin alone or a copy,
    bound by the two libdevice routines. Placed at the first of the two lines, within
    one block only (a name defined inside a loop body is not visible after it); a
    lone sin or cos becomes `_fl_sin` / `_fl_cos`."""
    out: list[Optional[str]] = list(lines)
    first: dict[tuple[str, str], tuple[int, str, str]] = {}
    for i, line in enumerate(lines):
        m = _TRIG.match(line)
        if m is None:
            continue
        indent, name, fn, arg = m.groups()
        key = (indent, arg)
        prev = first.get(key)
        if prev is not None and prev[1] != fn and all(
                len(ln) - len(ln.lstrip()) >= len(indent) for ln in lines[prev[0]:i] if ln.strip()):
            j, fj, nj = first.pop(key)
            sin_name, cos_name = (nj, name) if fj == "sin" else (name, nj)
            out[j] = f"{indent}{sin_name}, {cos_name} = _fl_sincos({arg})"
            out[i] = None
        else:
            first[key] = (i, fn, name)
    for i, line in enumerate(out):
        m = _TRIG.match(line) if line is not None else None
        if m is not None:
            indent, name, fn, arg = m.groups()
            out[i] = f"{indent}{name} = _fl_{fn}({arg})"
    return [ln for ln in out if ln is not None]


_TMP_DEF = re.compile(r"^\s*(tmp\d+) = ")
_TMP_USE = re.compile(r"\btmp\d+\b")


def drop_dead(lines: list[str]) -> list[str]:
    """Without the `tmpN = ...` lines nothing reads (every such line is a pure
    expression): what a rewrite such as the 16-bit GELU leaves behind, so the source
    a user reads shows only what runs."""
    uses: dict[str, int] = {}
    line_of: dict[str, int] = {}  # each tmpN is assigned once (TritonKernel.emit numbers them)
    reads: list[list[str]] = []
    for i, ln in enumerate(lines):
        m = _TMP_DEF.match(ln)
        if m:
            line_of[m.group(1)] = i
        reads.append(_TMP_USE.findall(ln[m.end():] if m else ln))
        for u in reads[-1]:
            uses[u] = uses.get(u, 0) + 1
    dead: set[int] = set()
    work = [n for n in line_of if not uses.get(n)]
    while work:
        i = line_of[work.pop()]
        dead.add(i)
        for u in reads[i]:
            uses[u] -= 1
            if not uses[u] and u in line_of:
                work.append(u)
    return [ln for i, ln in enumerate(lines) if i not in dead]
