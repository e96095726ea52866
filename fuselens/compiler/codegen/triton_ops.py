"""The `ops` handler that prints Triton, and the math mapping behind it.

Values are `TVal`s: a Triton expression or variable name plus the *logical*
torch dtype the IR gave it. Arithmetic runs in a wider *representation* dtype
where Triton needs one (Inductor's convention): bfloat16/float16 values are
float32 in registers (loads upcast, stores round), and the IR's float64
accumulators of float32 sums compute in float32 unless the kernel reads real
float64 data (`TritonKernel.demote_fp64`).

Math mapping. The Triton interpreter (`TRITON_INTERPRET=1`, how CI runs every
generated kernel on CPU) implements the `tl.*` math functions but fails on every
`libdevice.*` call. So each function has a form built from `tl.*` (exact where
the formula is exact: floor, round-half-even, fmod, Python-style integer
division) and, for the few where a formula loses accuracy (pow, tanh near 0,
atan, lgamma...), the GPU build uses libdevice and the interpreter build the
formula (`MathMode`). The tables below list each function's one form, or the
interpreter's formula beside the libdevice call's name, so they stay in step;
the `_fl_*` helpers they call are the prelude (triton_prelude.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from fuselens.compiler.codegen import COMPARISONS, SPELLED_ALIKE, PrintingOps, ops_from_table
from fuselens.compiler.runtime.triton_prelude import prelude_text

TL_DTYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

# op -> its form, for the interpreter and the GPU alike; "{x}"/"{a}"/"{b}" are the operands
_UNARY_FORMS = {
    "exp": "tl.exp({x})",
    "exp2": "tl.exp2({x})",
    "log": "tl.log({x})",
    "log2": "tl.log2({x})",
    "sqrt": "tl.sqrt_rn({x})",  # float64: _FLOAT64_UNARY
    "rsqrt": "_fl_rsqrt({x})",
    "reciprocal": "(1.0 / {x})",
    "sin": "tl.sin({x})",
    "cos": "tl.cos({x})",
    "erf": "tl.erf({x})",
    "sigmoid": "_fl_sigmoid({x})",
    "floor": "_fl_floor({x})",
    "ceil": "_fl_ceil({x})",
    "trunc": "_fl_trunc({x})",
    "round": "_fl_round({x})",
    "frac": "({x} - _fl_trunc({x}))",
}
_BINARY_FORMS = {"nextafter": "_fl_nextafter({a}, {b})"}
# op -> the interpreter's formula, where the GPU build calls `libdevice.<op>` instead
_LIBDEVICE_UNARY = {
    "log10": "(tl.log({x}) * 0.4342944819032518)",
    "tan": "(tl.sin({x}) / tl.cos({x}))",
    "erfc": "(1.0 - tl.erf({x}))",
    "tanh": "_fl_tanh({x})",
    "expm1": "_fl_expm1({x})",
    "log1p": "_fl_log1p({x})",
    "atan": "_fl_atan({x})",
    "asin": "_fl_asin({x})",
    "acos": "_fl_acos({x})",
    "sinh": "_fl_sinh({x})",
    "cosh": "_fl_cosh({x})",
    "asinh": "_fl_asinh({x})",
    "acosh": "_fl_acosh({x})",
    "atanh": "_fl_atanh({x})",
    "lgamma": "_fl_lgamma({x})",
}
_LIBDEVICE_BINARY = {
    "pow": "_fl_pow({a}, {b})",
    "atan2": "_fl_atan2({a}, {b})",
    "hypot": "tl.sqrt_rn({a} * {a} + {b} * {b})",
    "fmod": "({a} - _fl_trunc({a} / {b}) * {b})",
}


# float64 forms where the table's differ: tl.sqrt_rn takes float32 alone (the
# interpreter raises, a GPU compile fails); float64's tl.sqrt is correctly rounded
_FLOAT64_UNARY: dict[str, str] = {"sqrt": "tl.sqrt({x})"}


@dataclass
class MathMode:
    """Which form of the math tables to print: the interpreter's or the GPU's."""

    interpret: bool

    def unary(self, op: str) -> Optional[str]:
        return self._form(op, _UNARY_FORMS, _LIBDEVICE_UNARY, "{x}")

    def binary(self, op: str) -> Optional[str]:
        return self._form(op, _BINARY_FORMS, _LIBDEVICE_BINARY, "{a}, {b}")

    def _form(self, op: str, forms: dict[str, str], libdevice: dict[str, str], operands: str) -> Optional[str]:
        if op in libdevice and not self.interpret:
            return f"libdevice.{op}({operands})"
        return libdevice.get(op, forms.get(op))

    def prelude(self) -> str:
        return prelude_text(self.interpret)


@dataclass
class TVal:
    """A value in generated Triton code: expression/variable and logical dtype.
    `const` holds the Python value of a constant (lets pow(x, 2) print x*x)."""

    name: str
    dtype: torch.dtype
    const: Any = None

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FloatOrInt:
    """A binary op's form for floating-point operands and its form for integers."""

    floating: str
    integral: str


# Ops that are one Triton expression of their operands; the value has the operands'
# dtype. Ops with a special case are TritonOps methods, math functions in the math table.
_FORMS: dict[str, str | FloatOrInt] = {
    **SPELLED_ALIKE,
    "relu": "tl.where({x} < 0, 0, {x})",
    "floordiv": FloatOrInt("_fl_floor({a} / {b})", "_fl_floordiv_int({a}, {b})"),
    "truncdiv": FloatOrInt("_fl_trunc({a} / {b})", "_fl_truncdiv_int({a}, {b})"),
    "remainder": FloatOrInt("({a} - _fl_floor({a} / {b}) * {b})", "_fl_remainder_int({a}, {b})"),
    "maximum": FloatOrInt("_fl_maximum({a}, {b})", "_fl_imaximum({a}, {b})"),
    "minimum": FloatOrInt("_fl_minimum({a}, {b})", "_fl_iminimum({a}, {b})"),
    "fmax": "tl.where({a} != {a}, {b}, tl.where({b} != {b}, {a}, tl.maximum({a}, {b})))",
    "fmin": "tl.where({a} != {a}, {b}, tl.where({b} != {b}, {a}, tl.minimum({a}, {b})))",
    "lshift": "({a} << {b})", "rshift": "({a} >> {b})",
}
# Comparisons and logical ops: bool values.
_TO_BOOL = {
    **COMPARISONS, "logical_not": "({x} == 0)", "logical_and": "(({a} != 0) & ({b} != 0))",
    "logical_or": "(({a} != 0) | ({b} != 0))", "logical_xor": "(({a} != 0) ^ ({b} != 0))",
}


def tl_const(value: Any, dtype: torch.dtype) -> str:
    """A Python literal Triton reads as the right value (dtype comes from `tl.full`)."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        return repr(v)
    return str(int(value))


@ops_from_table(_FORMS)
@ops_from_table(_TO_BOOL, torch.bool)
class TritonOps(PrintingOps[TVal]):
    """Prints the IR's op contract (see ir.py) as Triton. Each op becomes
    `tmpN = expr` in the kernel's current scope (with CSE); see TritonKernel.
    Where each op is printed: a method below or a row of `_FORMS` or `_TO_BOOL`
    (`ops_from_table`), else the math tables of `self.math` (`__getattr__`)."""

    def __init__(self, kernel: Any) -> None:
        super().__init__(kernel)
        self.math = kernel.math
        # how the values that a 16-bit GELU is made of were computed: name -> (op, operands)
        self._origin: dict[str, tuple] = {}

    # -- dtypes
    def rep(self, dtype: torch.dtype) -> torch.dtype:
        return self.k.rep_dtype(dtype)

    # -- memory and constants
    def constant(self, value: Any, dtype: torch.dtype) -> TVal:
        # a 0-d typed tensor: usable in every op (`.to`, math) and broadcast by Triton
        return TVal(f"tl.full([], {tl_const(value, dtype)}, {TL_DTYPES[self.rep(dtype)]})", dtype, const=value)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> TVal:
        # an index read from a tensor is a block of values (ConvBERT's span offsets padded and
        # gathered), which tl.full does not take
        s, axes = self.k.index_with_gathers(expr)
        if not axes:  # a scalar: give it a dtype first
            s = f"tl.full([], {s}, tl.int64)"
        return self._emit(f"({s}).to({TL_DTYPES[self.rep(dtype)]})", dtype)

    def to_dtype(self, x: TVal, dtype: torch.dtype) -> TVal:
        if x.dtype == dtype:
            return x
        if x.const is not None and not isinstance(x.const, bool) and dtype != torch.bool:
            v = x.const
            if not dtype.is_floating_point:
                v = int(v) if not (isinstance(v, float) and (math.isnan(v) or math.isinf(v))) else 0
            return self.constant(v, dtype)
        if dtype == torch.bool:
            if x.const is not None:  # folded: NaN is true, as in torch; BioGPT's mask of ones
                return self.constant(bool(x.const), dtype)
            return self._emit(f"({x} != 0)", dtype)
        if dtype in (torch.bfloat16, torch.float16) and x.dtype.is_floating_point:
            # an explicit cast in the graph: round as eager does, keep float32 in registers
            down = f"_fl_to_bf16({x})" if dtype == torch.bfloat16 else f"{x}.to({TL_DTYPES[dtype]})"
            return self._emit(f"{down}.to(tl.float32)", dtype)
        src, dst = self.rep(x.dtype), self.rep(dtype)
        if src == dst:
            return TVal(x.name, dtype)
        return self._emit(f"{x}.to({TL_DTYPES[dst]})", dtype)

    def where(self, c: TVal, a: TVal, b: TVal) -> TVal:
        return self._emit(f"tl.where({c}, {a}, {b})", a.dtype)

    def rand(self, seed: TVal, offset: TVal) -> TVal:
        return self._emit(f"tl.rand({seed}, {offset})", torch.float32)

    def randn(self, seed: TVal, offset: TVal) -> TVal:
        return self._emit(f"tl.randn({seed}, {offset})", torch.float32)

    def masks_branch_loads(self, c: TVal) -> bool:
        """ir.masks_branch_loads: whether `masked_where(c, ...)` below reads each branch
        only where it is taken (one number takes one branch). A condition the same for
        every lane (a cat read at one position) would leave the branch's loads without a
        block, and unmasked."""
        return c.const is not None or (self.k.from_index(c) and not self.k.is_scalar(c.name))

    def masked_where(self, c: TVal, then: Callable[[], TVal], otherwise: Callable[[], TVal]) -> TVal:
        """ir.masked_where: each branch's loads masked by its condition (TritonKernel.masked)
        when the condition comes from indices (a cat's, a pad's, a select's). A mask read
        from data (a ReLU's backward) changes within a vector: Triton would split each
        16-byte load into scalar ones (ResNet-50 training: 6.75 -> 7.36 ms of kernels, H200)."""
        if c.const is not None:  # one number (a mask of ones, folded): one branch, nothing to mask
            return then() if c.const else otherwise()
        if not self.k.from_index(c):
            return self.where(c, then(), otherwise())
        with self.k.masked(c):
            a = then()
        with self.k.masked(self.logical_not(c)):
            b = otherwise()
        return self.where(c, a, b)

    # -- the math table's functions (erf, fmod and pow are methods: they have special cases)
    def __getattr__(self, op: str) -> Any:
        if op.startswith("_"):
            raise AttributeError(op)
        binary = self.math.binary(op)
        if binary is not None:
            return lambda a, b: self._bin(binary, a, b)
        form = self.math.unary(op)
        if form is None:
            raise AttributeError(op)

        def unary(x: TVal) -> TVal:
            if not x.dtype.is_floating_point:
                if op in ("floor", "ceil", "round", "trunc"):
                    return x
                if op == "frac":
                    return self.constant(0, x.dtype)
                x = self.to_dtype(x, torch.float32)  # int -> float math (sqrt of an int tensor)
            own = _FLOAT64_UNARY.get(op, form) if x.dtype == torch.float64 else form
            return self._emit(own.format(x=x), x.dtype)

        return unary

    def erf(self, x: TVal) -> TVal:
        if not x.dtype.is_floating_point:
            x = self.to_dtype(x, torch.float32)
        if self._short_math(x):
            # every value this kernel writes is rounded to 16 bits: the short erf is exact enough
            return self._note(self._emit(f"_fl_erf_16bit({x})", x.dtype), "erf", x)
        return self._emit(self.math.unary("erf").format(x=x), x.dtype)

    def _short_math(self, x: TVal) -> bool:
        return getattr(self.k, "out16", False) and self.rep(x.dtype) == torch.float32

    def _note(self, v: TVal, op: str, *args: TVal) -> TVal:
        self._origin[v.name] = (op, args)
        return v

    def _const_operand(self, name: str, op: str, value: float) -> Optional[TVal]:
        """x when `name` was computed as op(x, value) or op(value, x), else None."""
        op_, args = self._origin.get(name, (None, ()))
        if op_ != op:
            return None
        a, b = args
        if b.const is not None and b.const == value and a.const is None:
            return a
        if a.const is not None and a.const == value and b.const is None:
            return b
        return None

    def _gelu_of(self, a: TVal, b: TVal) -> Optional[TVal]:
        """x when a * b is GELU's decomposition (x*0.5) * (erf(x*M_SQRT1_2) + 1)."""
        for half, one_plus in ((a, b), (b, a)):
            x = self._const_operand(half.name, "mul", 0.5)
            e = self._const_operand(one_plus.name, "add", 1.0)
            if x is None or e is None:
                continue
            op, args = self._origin.get(e.name, (None, ()))
            if op == "erf" and self._const_operand(args[0].name, "mul", math.sqrt(0.5)) is x:
                return x
        return None

    def abs(self, x: TVal) -> TVal:
        if x.dtype == torch.bool:
            return x
        return self._emit(f"tl.abs({x})", x.dtype)

    def sign(self, x: TVal) -> TVal:
        if x.dtype == torch.bool:
            return x
        if x.dtype.is_floating_point:
            return self._emit(f"tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, {x}))", x.dtype)
        return self._emit(f"(({x} > 0).to({TL_DTYPES[x.dtype]}) - ({x} < 0).to({TL_DTYPES[x.dtype]}))", x.dtype)

    def isnan(self, x: TVal) -> TVal:
        if not x.dtype.is_floating_point:
            return self.constant(False, torch.bool)
        return self._emit(f"({x} != {x})", torch.bool)

    def isinf(self, x: TVal) -> TVal:
        if not x.dtype.is_floating_point:
            return self.constant(False, torch.bool)
        return self._emit(f"(tl.abs({x}) == float(\"inf\"))", torch.bool)

    def signbit(self, x: TVal) -> TVal:
        if not x.dtype.is_floating_point:
            return self._emit(f"({x} < 0)", torch.bool)
        ity = "tl.int64" if self.rep(x.dtype) == torch.float64 else "tl.int32"
        return self._emit(f"({x}.to({ity}, bitcast=True) < 0)", torch.bool)

    def bitwise_not(self, x: TVal) -> TVal:
        if x.dtype == torch.bool:
            return self.logical_not(x)
        return self._emit(f"(~{x})", x.dtype)

    # -- binary
    def _bin(self, form: str | FloatOrInt, a: TVal, b: TVal, dtype: Optional[torch.dtype] = None) -> TVal:
        if isinstance(form, FloatOrInt):
            form = form.floating if a.dtype.is_floating_point else form.integral
        return self._emit(form.format(a=a, b=b), dtype or a.dtype)

    def add(self, a, b):  # noqa: D102 - the IR contract
        if a.dtype == torch.bool:
            return self._bin("({a} | {b})", a, b)
        v = self._bin("({a} + {b})", a, b)
        return self._note(v, "add", a, b) if self._short_math(a) else v

    def mul(self, a, b):
        if a.dtype == torch.bool:
            return self._bin("({a} & {b})", a, b)
        if self._short_math(a):
            x = self._gelu_of(a, b)
            if x is not None:  # x*0.5 etc. are now unread: drop_dead takes them out of the source
                return self._emit(f"_fl_gelu_16bit({x})", a.dtype)
            return self._note(self._bin("({a} * {b})", a, b), "mul", a, b)
        return self._bin("({a} * {b})", a, b)

    def truediv(self, a, b):
        if not a.dtype.is_floating_point:
            a, b = self.to_dtype(a, torch.float32), self.to_dtype(b, torch.float32)
        return self._bin("({a} / {b})", a, b)

    def fmod(self, a, b):
        if a.dtype.is_floating_point:
            return self._bin(self.math.binary("fmod"), a, b)
        return self._bin("_fl_fmod_int({a}, {b})", a, b)

    def pow(self, a, b):
        if b.const is not None and not isinstance(b.const, bool) and a.dtype.is_floating_point:
            e = float(b.const)
            if e == 2.0:
                return self._bin("({a} * {a})", a, b)
            if e == 3.0:
                return self._bin("({a} * {a} * {a})", a, b)
            if e == 1.0:
                return a
            if e == 0.5:
                form = _FLOAT64_UNARY["sqrt"] if a.dtype == torch.float64 else "tl.sqrt_rn({x})"
                return self._emit(form.format(x=a), a.dtype)
            if e == -0.5:
                return self._emit(f"_fl_rsqrt({a})", a.dtype)
            if e == -1.0:
                return self._emit(f"(1.0 / {a})", a.dtype)
        if not a.dtype.is_floating_point:
            return self._bin("_fl_pow_int({a}, {b})", a, b)
        return self._bin(self.math.binary("pow"), a, b)

    def copysign(self, a, b):
        sb = self.signbit(b)
        return self._emit(f"tl.where({sb}, -tl.abs({a}), tl.abs({a}))", a.dtype)
