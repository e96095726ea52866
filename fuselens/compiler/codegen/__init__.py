"""Code generators: turn a scheduled KernelGroup into source text.

The interface every generator implements (C++ in `cpp.py`, Triton in `triton.py`;
`generate_library` runs one over a schedule, each target in targets/ picks its own):

    generate(group: KernelGroup, graph: GraphIR, options) -> KernelSource
    library_source(kernels: list[KernelSource]) -> str      # one compilation unit per graph
    canonical_source(ks: KernelSource) -> str               # the kernel with name and buffers renamed
    alias_source(ks: KernelSource, same: KernelSource) -> str  # ks, defined as the identical `same`

The IR hands a generator everything through `group.nodes` (ComputeNodes with
bodies written against the `ops` handler contract in `ir.py`), `group.full` /
`group.rflags` (the iteration space), `group.level(node)` / `group.own_index`
(where each value lives) and `group.stores` (what must reach memory).

The two `ops` handlers that print source (cpp_ops.py, triton_ops.py) share
`PrintingOps`; ops that are one expression are rows of tables (`ops_from_table`),
those spelled alike in both languages here.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

import sympy


@dataclass
class KernelSource:
    """One generated kernel: its function text and its calling convention.
    Arguments are, in order: a pointer per name in `buffers` (inputs first, then
    `outputs`), then one int64 per symbol in `symbols`."""

    name: str
    source: str
    buffers: list[str]
    outputs: list[str]
    symbols: list[sympy.Symbol] = field(default_factory=list)
    bytes_accessed: int = 0
    language: str = "cpp"
    kind: str = "cpp"  # Kernel.kind of the report: "cpp" | "triton" (added for the Triton generator)
    device: str = "cpu"  # Kernel.device of the report (Triton sets "cuda" unless interpreted)
    inplace: dict = field(default_factory=dict)
    """output -> inputs the kernel reads only at the element it writes (same dtype and
    layout): the runtime may write the output into a dying input's storage (C++ only)."""



def reduction_phases(group: Any, members: dict) -> dict[str, int]:
    """The pass over the rows each member of a kernel group runs in (both targets): a
    pointwise member reading a finished reduction (or its outer epilogue) runs one pass
    later; an outer member runs in the pass of its latest input."""
    phase: dict[str, int] = {}
    for n in group.nodes:
        deps = [members[r] for r in n.reads if r in members]
        if group.level(n) == "outer":
            phase[n.name] = max([phase[d.name] for d in deps] or [-1])
        else:
            phase[n.name] = max([0] + [phase[d.name] + (1 if group.level(d) in ("reduction", "outer") else 0)
                                       for d in deps])
    return phase


class KernelBuilder:
    """What both generators keep while printing one kernel group: its members, the
    buffers it reads and writes, the size symbols it takes and the pass over the rows
    each member runs in (`reduction_phases`)."""

    def __init__(self, group: Any, graph: Any, options: Any) -> None:
        self.g = group
        self.graph = graph
        self.opt = options
        self.members = {n.name: n for n in group.nodes}
        self.ranges = group.ranges()
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.symbols: set[sympy.Symbol] = set()
        self.counter = 0
        self.phase: dict[str, int] = {}

    # A builder's ops (`self.ops`) hold the builder: a cycle, and through `graph` it held a
    # graph's whole IR until the collector's next pass over the compile's objects (ResNet-50
    # training: 145,000 of the 317,000 objects of cyclic garbage a compile left, a third of
    # that pass's time). Released once printed (or used as a context), the builder drops its
    # ops, and the IR is freed when the compile lets go of it.
    def release(self) -> None:
        self.ops = None

    def __enter__(self) -> "KernelBuilder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


@dataclass
class GeneratedLibrary:
    """A graph's kernels and the one compilation unit that holds them."""

    kernels: dict[str, KernelSource]  # by kernel name, in schedule order
    source: str  # the library: each kernel, or an alias of an identical one
    spans: list[tuple[str, int, int]]  # (kernel, first line, last line) in `source`, for build errors

    @property
    def empty(self) -> bool:
        return not self.kernels


def generate_library(generator: Any, groups: Sequence[Any], graph: Any, options: Any) -> GeneratedLibrary:
    """Every kernel group through `generator` (a module with the interface above);
    a kernel identical to an earlier one up to names is defined as its alias."""
    kernels: dict[str, KernelSource] = {}
    spans = []
    parts = []
    first_of: dict[str, KernelSource] = {}
    line = generator.library_source([]).count("\n") + 1
    for grp in groups:
        ks = generator.generate(grp, graph, options)
        if options.source_hook is not None:
            ks.source = options.source_hook(grp.name, ks.source)
        kernels[grp.name] = ks
        same = first_of.setdefault(generator.canonical_source(ks), ks)
        part = ks if same is ks else dataclasses.replace(ks, source=generator.alias_source(ks, same))
        n = part.source.count("\n") + 1
        spans.append((grp.name, line, line + n))
        line += n
        parts.append(part)
    return GeneratedLibrary(kernels, generator.library_source(parts), spans)


def canonical_text(source: str, name: str, param_pattern: str) -> str:
    """A kernel's text with its name and its buffer parameters renamed by position.
    Two kernels with the same canonical text compute the same thing on different
    buffers (a model's repeated layers): the library defines the body once
    (`alias_source`), so it is compiled once, as Inductor does."""
    text = re.sub(rf"\b{re.escape(name)}\b", "K", source)
    names: dict[str, str] = {}
    return re.sub(param_pattern, lambda m: names.setdefault(m.group(0), f"p{len(names)}"), text)


# Ops that C++ and Triton (Python) spell alike: op -> its form of `{x}`, or of `{a}` and `{b}`.
SPELLED_ALIKE = {
    "neg": "(-{x})", "square": "({x} * {x})", "sub": "({a} - {b})",
    "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})", "bitwise_xor": "({a} ^ {b})",
}
# The comparisons (bool values), spelled alike too.
COMPARISONS = {
    "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})",
    "gt": "({a} > {b})", "ge": "({a} >= {b})",
}

Value = TypeVar("Value")


class PrintingOps(Generic[Value]):
    """What the `ops` handlers that print source (cpp_ops.CppOps, triton_ops.TritonOps)
    share: the kernel they print into, whose `emit` writes one value (with CSE) and
    whose `load` reads a buffer element; values are the kernel's (`Value`)."""

    def __init__(self, kernel: Any) -> None:
        self.k = kernel

    def _emit(self, expr: str, dtype: Any) -> Value:
        return self.k.emit(expr, dtype)

    def _print(self, form: Any, operands: tuple, dtype: Optional[Any]) -> Value:
        """A table's form (`ops_from_table`) of one operand `{x}` or two, `{a}` and `{b}`
        (the handler's `_bin`); the value has `dtype`, else the operands'."""
        if len(operands) == 1:
            return self._emit(form.format(x=operands[0]), dtype or operands[0].dtype)
        return self._bin(form, *operands, dtype)

    def _bin(self, form: Any, a: Any, b: Any, dtype: Optional[Any] = None) -> Value:
        """A binary form of `a` and `b`, as the target needs it (C++ casts integer
        promotions back, Triton picks a `FloatOrInt` form by the operands' dtype)."""
        raise NotImplementedError

    def load(self, name: str, index: Any) -> Value:
        return self.k.load(name, index)

    def indirect(self, value: Value, size: Any) -> Any:
        """`value` (an integer tensor element) as an index of a dim of `size`: an
        `ir.Indirect` symbol for index expressions, clamped into the dim (eager raises
        on an index outside it; a kernel must not read outside the buffer)."""
        return self.k.indirect(value, size)


def ops_from_table(forms: dict[str, Any], result: Optional[Any] = None) -> Callable[[type], type]:
    """A class decorator for a `PrintingOps` handler: a method per op in `forms` (op
    name -> its form of the operands, `{x}` or `{a}` and `{b}`) that prints the form
    (`PrintingOps._print`); `result` is the value's dtype (None: the operands')."""

    def method(op: str, form: Any) -> Callable[..., Any]:
        def print_op(self: PrintingOps, *operands: Any) -> Any:
            return self._print(form, operands, result)

        print_op.__name__ = print_op.__qualname__ = op
        return print_op

    def add_methods(cls: type) -> type:
        for op, form in forms.items():
            if op in vars(cls):  # a special-cased op is a method; the table must not hide it
                raise TypeError(f"{cls.__name__}.{op} is both a method and in a table of forms")
            setattr(cls, op, method(op, form))
        return cls

    return add_methods


def cname(name: str) -> str:
    """A buffer name as part of a C or Python identifier."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
