"""The `ops` handler that prints C++ (`CppOps`), and how index expressions,
constants and dtypes are spelled in C. `CppKernel` (cpp.py) owns the scopes the
ops emit into; each op emits `const T tN = expr;` there (with CSE) and returns
the variable as a `CVal`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import sympy
import torch

from fuselens.compiler.codegen import COMPARISONS, SPELLED_ALIKE, PrintingOps, ops_from_table
from fuselens.compiler.ir import Expr, FloorDiv, ModularIndexing

# The C type a value of each dtype is computed in. bfloat16 values are floats (ATen's
# opmath), rounded where eager rounds them (CppOps.round_to) and stored as their 16 bits
# (storage_ctype).
CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
    torch.bfloat16: "float",
}
HALVES = {torch.bfloat16: "bf16"}  # 16-bit float dtype -> suffix of the prelude's converters


def storage_ctype(dtype: torch.dtype) -> str:
    """The C element type of a buffer (pointer parameters)."""
    return "uint16_t" if dtype in HALVES else CTYPES[dtype]


def is_float(dtype: torch.dtype) -> bool:
    """Computed as C float (float32, and bfloat16 through opmath)."""
    return CTYPES.get(dtype) == "float"


def cexpr(e: Any) -> str:
    """A sympy index expression as C (int64 arithmetic, non-negative divisions)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        v = int(e)
        return f"INT64_C({v})" if abs(v) > 2**31 - 1 else str(v)
    if e.is_Symbol:
        return e.name
    if isinstance(e, sympy.Add):
        terms = [cexpr(a) for a in e.args]
        return "(" + " + ".join(terms) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(cexpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return "(" + " * ".join([cexpr(e.base)] * int(e.exp)) + ")"
    if isinstance(e, FloorDiv):
        return f"({cexpr(e.args[0])} / {cexpr(e.args[1])})"
    if isinstance(e, ModularIndexing):
        return f"(({cexpr(e.args[0])} / {cexpr(e.args[1])}) % {cexpr(e.args[2])})"
    if isinstance(e, sympy.Min):
        return _fold("fl_imin", [cexpr(a) for a in e.args])
    if isinstance(e, sympy.Max):
        return _fold("fl_imax", [cexpr(a) for a in e.args])
    if isinstance(e, sympy.Rational):
        return f"({e.p} / {e.q})"
    raise NotImplementedError(f"cannot print index expression {e!r} as C")


def _fold(fn: str, args: list[str]) -> str:
    out = args[0]
    for a in args[1:]:
        out = f"{fn}({out}, {a})"
    return out


def cconst(value: Any, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        single = is_float(dtype)
        if math.isnan(v):
            return "NAN" if single else "std::numeric_limits<double>::quiet_NaN()"
        if math.isinf(v):
            return ("" if v > 0 else "-") + ("INFINITY" if single else "std::numeric_limits<double>::infinity()")
        return f"{v!r}f" if single else repr(v)
    v = int(value)
    if v == -(2**63):
        return "std::numeric_limits<int64_t>::min()"
    return f"static_cast<{CTYPES[dtype]}>(INT64_C({v}))"


@dataclass
class CVal:
    name: str
    dtype: torch.dtype

    def __str__(self) -> str:
        return self.name


_UNARY_FLOAT = {
    "exp": "fl_exp({x})", "log": "fl_log({x})", "sin": "fl_sin({x})", "cos": "fl_cos({x})",
    "tanh": "fl_tanh({x})", "erf": "fl_erf({x})", "sigmoid": "fl_sigmoid({x})",
    "exp2": "std::exp2({x})", "expm1": "std::expm1({x})", "log2": "std::log2({x})", "log10": "std::log10({x})",
    "log1p": "std::log1p({x})", "sqrt": "std::sqrt({x})", "rsqrt": "({one} / std::sqrt({x}))",
    "reciprocal": "({one} / {x})", "tan": "std::tan({x})", "asin": "std::asin({x})", "acos": "std::acos({x})",
    "atan": "std::atan({x})", "sinh": "std::sinh({x})", "cosh": "std::cosh({x})", "asinh": "std::asinh({x})",
    "acosh": "std::acosh({x})", "atanh": "std::atanh({x})", "erfc": "std::erfc({x})", "floor": "std::floor({x})",
    "ceil": "std::ceil({x})", "round": "std::nearbyint({x})", "trunc": "std::trunc({x})", "lgamma": "std::lgamma({x})",
    "frac": "fl_frac({x})",
}


# Ops that are one C++ expression of their operands (`{T}`: their C type); the value has
# the operands' dtype. Ops with a special case are CppOps methods.
_FORMS = {
    **SPELLED_ALIKE, "abs": "fl_abs({x})", "sign": "fl_sign({x})", "relu": "fl_relu({x})",
    "floordiv": "fl_floordiv<{T}>({a}, {b})", "truncdiv": "fl_truncdiv<{T}>({a}, {b})",
    "remainder": "fl_remainder<{T}>({a}, {b})", "fmod": "fl_fmod<{T}>({a}, {b})", "pow": "fl_pow<{T}>({a}, {b})",
    "maximum": "fl_maximum<{T}>({a}, {b})", "minimum": "fl_minimum<{T}>({a}, {b})",
    "fmax": "std::fmax({a}, {b})", "fmin": "std::fmin({a}, {b})", "atan2": "std::atan2({a}, {b})",
    "hypot": "std::hypot({a}, {b})", "copysign": "std::copysign({a}, {b})", "nextafter": "std::nextafter({a}, {b})",
    "lshift": "fl_shl<{T}>({a}, {b})", "rshift": "fl_shr<{T}>({a}, {b})",
}
# Comparisons and logical ops: bool values.
_TO_BOOL = {
    **COMPARISONS, "logical_not": "(!{x})", "logical_and": "({a} && {b})", "logical_or": "({a} || {b})",
    "logical_xor": "({a} != {b})",
}


# Index-valued dtypes whose values codegen knows symbolically (CppKernel.index_of)
_INDEX_DTYPES = (torch.int64, torch.int32)
# The literal values of bool constants and folded conditions
_KNOWN = {"true": True, "false": False}
# The printed forms a known operand may decide: form -> op
_FOLDED = {**{form: op for op, form in COMPARISONS.items()},
           "({a} && {b})": "logical_and", "({a} || {b})": "logical_or"}


def _fold_bool(op: str, a: CVal, b: CVal) -> Any:
    """`a and b` / `a or b` where an operand is a known bool: the answer or the other operand."""
    for x, y in ((a, b), (b, a)):
        if x.name in _KNOWN:
            if op == "logical_and":
                return y if _KNOWN[x.name] else x
            return x if _KNOWN[x.name] else y
    return None


class CppKernel(Protocol):
    """The scopes CppOps prints into (cpp.CppKernel) and what it knows of bfloat16 values."""

    rounded: set[str]
    unrounded: dict[str, CVal]
    widened: dict[str, CVal]

    def emit(self, expr: str, dtype: torch.dtype) -> CVal: ...

    def load(self, name: str, index: Expr) -> CVal: ...

    def simplify(self, e: Expr) -> Expr: ...

    index_of: dict[str, Expr]

    def fold_compare(self, op: str, a: CVal, b: CVal) -> Optional[bool]: ...


@ops_from_table(_FORMS)
@ops_from_table(_TO_BOOL, torch.bool)
class CppOps(PrintingOps[CVal]):
    """The `ops` handler that prints C++ (the contract in ir.py). Each op emits
    `const T tN = expr;` into the current scope (with CSE) and returns the variable.
    Where each op is printed: a method below or a row of `_FORMS` or `_TO_BOOL`
    (`ops_from_table`), else the float functions of `_UNARY_FLOAT` (`__getattr__`)."""

    k: CppKernel

    # -- memory and constants
    def constant(self, value: Any, dtype: torch.dtype) -> CVal:
        v = CVal(cconst(value, dtype), dtype)
        if dtype in _INDEX_DTYPES:
            self.k.index_of[v.name] = sympy.Integer(int(value))
        return v

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> CVal:
        e = self.k.simplify(expr)
        v = self._emit(f"static_cast<{CTYPES[dtype]}>({cexpr(e)})", dtype)
        if dtype in _INDEX_DTYPES:
            self.k.index_of[v.name] = e
        return self.round_to(v, dtype)

    def to_dtype(self, x: CVal, dtype: torch.dtype) -> CVal:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._emit(f"({x} != 0)", dtype)
        if dtype in HALVES:  # a value of the 16-bit type: rounded to it, held as float
            v = self._emit(f"fl_round_{HALVES[dtype]}(static_cast<float>({x}))", dtype)
            self.k.rounded.add(v.name)
            return v
        v = self._emit(f"static_cast<{CTYPES[dtype]}>({x})", dtype)
        if x.dtype == torch.float32 and dtype == torch.float64:
            self.k.widened[v.name] = x  # a float sum may accumulate the float itself
        return v

    def round_to(self, x: CVal, dtype: torch.dtype) -> CVal:
        """`x` (a float computed for a bfloat16 result) rounded to that type, as
        eager rounds every op's result; values already representable pass through."""
        if dtype not in HALVES or x.name in self.k.rounded:
            return x
        v = self._emit(f"fl_round_{HALVES[dtype]}({x})", dtype)
        self.k.rounded.add(v.name)
        self.k.unrounded[v.name] = x  # a store converts x itself (the rounding is then dead code)
        return v

    def where(self, c: CVal, a: CVal, b: CVal) -> CVal:
        if c.name in _KNOWN:  # the select's value has a's dtype, as the printed one does
            return a if _KNOWN[c.name] else self.to_dtype(b, a.dtype)
        return self._emit(f"({c} ? {a} : {b})", a.dtype)

    def masked_where(self, c: CVal, then: Any, otherwise: Any) -> CVal:
        """ir.masked_where: both branches computed, as a select (C++ masks no loads), but
        only the taken one where the condition is known (a piece of a split loop)."""
        if c.name in _KNOWN:
            return then() if _KNOWN[c.name] else otherwise()
        return self.where(c, then(), otherwise())

    def rand(self, seed: CVal, offset: CVal) -> CVal:
        return self._emit(f"fl_rand({seed}, {offset})", torch.float32)

    def randn(self, seed: CVal, offset: CVal) -> CVal:
        return self._emit(f"fl_randn({seed}, {offset})", torch.float32)

    # -- unary
    def __getattr__(self, op: str) -> Any:
        if op in _UNARY_FLOAT:
            fmt = _UNARY_FLOAT[op]

            def unary(x: CVal) -> CVal:
                if not x.dtype.is_floating_point:
                    if op in ("floor", "ceil", "round", "trunc"):
                        return x
                    raise NotImplementedError(f"{op} of {x.dtype}")
                if op in ("sin", "cos") and is_float(x.dtype):
                    return self._trig(op, x)
                return self._emit(fmt.format(x=x, one=cconst(1, x.dtype)), x.dtype)

            return unary
        raise AttributeError(op)

    def _trig(self, op: str, x: CVal) -> CVal:
        """float32 sin/cos. In a vectorized loop, the prelude's fast reduction, with
        the argument noted for the loop's large-argument check (`CppKernel._trig_redo`);
        anywhere else (once per row) the exact one."""
        k = self.k
        if k.trig_args is None:
            return self._emit(f"fl_{op}_exact({x})", x.dtype)
        v = self._emit(f"fl_{op}({x})", x.dtype)
        if x.name not in k.trig_args:
            k.trig_args.append(x.name)
        return v

    def isnan(self, x: CVal) -> CVal:
        return self._emit(f"({x} != {x})" if x.dtype.is_floating_point else "false", torch.bool)

    def isinf(self, x: CVal) -> CVal:
        if not x.dtype.is_floating_point:
            return self._emit("false", torch.bool)
        return self._emit(f"(std::fabs({x}) == std::numeric_limits<{CTYPES[x.dtype]}>::infinity())", torch.bool)

    def signbit(self, x: CVal) -> CVal:
        return self._emit(f"std::signbit({x})" if x.dtype.is_floating_point else f"({x} < 0)", torch.bool)

    def bitwise_not(self, x: CVal) -> CVal:
        if x.dtype == torch.bool:
            return self.logical_not(x)
        return self._emit(f"static_cast<{CTYPES[x.dtype]}>(~{x})", x.dtype)

    # -- binary
    def _bin(self, fmt: str, a: CVal, b: CVal, dtype: Optional[torch.dtype] = None) -> CVal:
        dt = dtype or a.dtype
        if fmt in _FOLDED:
            known = _fold_bool(_FOLDED[fmt], a, b) if _FOLDED[fmt].startswith("logical") \
                else self.k.fold_compare(_FOLDED[fmt], a, b)
            if isinstance(known, CVal):
                return known
            if known is not None:
                return CVal("true" if known else "false", torch.bool)
        expr = fmt.format(a=a, b=b, T=CTYPES[a.dtype])
        if dt != torch.bool and not dt.is_floating_point and dt not in (torch.int64,):
            expr = f"static_cast<{CTYPES[dt]}>({expr})"  # C integer promotion
        return self._emit(expr, dt)

    def add(self, a, b):  # noqa: D102
        if a.dtype == torch.bool:
            return self._bin("({a} || {b})", a, b)
        return self._bin("({a} + {b})", a, b)

    def mul(self, a, b):
        if a.dtype == torch.bool:
            return self._bin("({a} && {b})", a, b)
        return self._bin("({a} * {b})", a, b)

    def truediv(self, a, b):
        k = self.k
        if (a.dtype.is_floating_point and k.outer_scope is not None and k.scope is not k.outer_scope
                and b.name in k.outer_names and b.name not in k.hoisted):
            # The divisor is fixed for the whole inner loop (softmax's row sum): one
            # reciprocal per row, a multiply per element (vdivps costs ~10x vmulps).
            # Within 1 ulp of a / b, as ATen's softmax (it multiplies by 1/sum too);
            # differs only for a subnormal divisor, whose reciprocal overflows. Not for a
            # divisor merely hoisted out of the loop (avg_pool's window size): that
            # division was exact before, as ATen's.
            saved, k.scope = k.scope, k.outer_scope
            r = k.emit(f"({cconst(1, b.dtype)} / {b})", b.dtype)
            k.scope = saved
            return self._bin("({a} * {b})", a, r)
        return self._bin("({a} / {b})", a, b)
