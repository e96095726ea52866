"""How a Triton kernel's source is printed: values into nested scopes (the kernel body,
an r loop) with common subexpressions shared (`Scope`), and the `Emission` mixin of
TritonKernel that prints one value, tracks which values come from data rather than
indices, and masks the loads of a branch taken only where a condition holds."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch

from fuselens.compiler.codegen.triton_ops import TVal

TMP = re.compile(r"\btmp\d+\b")
# what a 0-d value's expression may hold besides other 0-d values: tl.* calls and dtypes,
# methods (`.to`), our prelude's helpers and numbers (an exponent's e is not a name)
_NOT_NAMES = re.compile(r"\btl\.\w+|\.\w+|\b_fl_\w+|(?<![\w.])\d[\w.]*(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_]\w*")
_LITERALS = {"float", "inf", "nan", "True", "False"}  # float("inf"), booleans


def _reads_data(expr: str) -> bool:
    """Whether an expression itself reads memory or an accumulator (a load, a reduction's
    running value): where values computed from data begin."""
    return "tl.load(" in expr or "acc" in expr


@dataclass
class Scope:
    """Lines at one indent, the expressions already printed there (`cache`) and the
    compute nodes' values (`values`); lookups go out to enclosing scopes."""

    lines: list[str]
    indent: int
    parent: Optional["Scope"] = None
    cache: dict[str, TVal] = field(default_factory=dict)
    values: dict[str, TVal] = field(default_factory=dict)

    def find_cache(self, expr: str) -> Optional[TVal]:
        return self._find("cache", expr)

    def find_value(self, name: str) -> Optional[TVal]:
        return self._find("values", name)

    def _find(self, table: str, key: str) -> Optional[TVal]:
        """`key` in this scope's `table` or the nearest enclosing scope's."""
        s: Optional[Scope] = self
        while s is not None:
            found = getattr(s, table).get(key)
            if found is not None:
                return found
            s = s.parent
        return None


class Emission:
    """TritonKernel's printing of values. The kernel sets `scope` (where values go now),
    `counter`, `from_data` (names of values computed from a load or a reduction),
    `exprs` (each printed value's expression), `zero_d` (loads of one element, the same
    for every lane) and `load_conds` (the conditions the loads being printed are masked by,
    each entry the conjunction of those before it and its own)."""

    scope: Scope
    counter: int
    from_data: set[str]
    zero_d: set[str]
    exprs: dict[str, str]
    load_conds: list[str]

    def emit(self, expr: str, dtype: torch.dtype, scope: Optional[Scope] = None) -> TVal:
        sc = scope or self.scope
        hit = sc.find_cache(expr)
        if hit is not None and hit.dtype == dtype:
            return hit
        self.counter += 1
        v = TVal(f"tmp{self.counter}", dtype)
        sc.lines.append(f"{'    ' * sc.indent}{v.name} = {expr}")
        sc.cache[expr] = v
        if _reads_data(expr) or any(t in self.from_data for t in TMP.findall(expr)):
            self.from_data.add(v.name)
        self.exprs[v.name] = expr
        return v

    def is_scalar(self, name: str) -> bool:
        """Whether value `name` is computed from constants and one-element loads alone
        (0-d: no block; a cross entropy's target of a batch of two, unrolled). Asked
        only of gathers' indices, so derived when asked, not for every value printed;
        walked without recursion (a fused kernel's chain of values can be long)."""
        todo, seen = [name], set()
        while todo:
            n = todo.pop()
            if n in seen or n in _LITERALS or n in self.zero_d:
                continue
            seen.add(n)
            expr = self.exprs.get(n)
            if expr is None or _reads_data(expr):  # a block's load, a reduction, an index, an argument
                return False
            todo.extend(_NAME.findall(_NOT_NAMES.sub(" ", expr)))
        return True

    def from_index(self, v: TVal) -> bool:
        """Whether `v` is computed from indices alone (no load, no reduction): the same
        across a vector of neighbouring elements where it changes only at a boundary."""
        return v.name not in self.from_data

    def line(self, text: str, scope: Optional[Scope] = None) -> None:
        sc = scope or self.scope
        sc.lines.append(f"{'    ' * sc.indent}{text}")

    @contextlib.contextmanager
    def masked(self, cond: TVal) -> Iterator[None]:
        """Loads printed inside read only where `cond` holds (ir.masked_where's branch).
        Members computed inside are forgotten after: their values are zero where it
        does not hold, and a reader outside must compute them again."""
        values = dict(self.scope.values)
        # the conjunction with the enclosing branches' condition, once here: a cat of k parts
        # nests k branches, and each load and-ing every enclosing condition itself cost k^2/2
        # ands an element (DenseNet-121's 24-part cats: 0.13 ms a kernel against 0.05 in Inductor)
        self.load_conds.append(self.emit(f"{self.load_conds[-1]} & {cond.name}", torch.bool).name
                               if self.load_conds else cond.name)
        try:
            yield
        finally:
            self.load_conds.pop()
            self.scope.values = values
