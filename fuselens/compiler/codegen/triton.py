"""Triton code generation: one `@triton.jit` kernel per KernelGroup.

Same IR, same fusion decisions as the C++ path (`cpp.py`); only the `ops`
handler (`triton_ops.TritonOps`) and the loop structure differ. A kernel maps
the group's iteration space onto one or two block axes:

* pointwise, 1-D: every dim on axis `x` (`xindex`, XBLOCK lanes per program);
  dims are ordered by the output's strides, so a channels-last tensor is walked
  in memory order and the whole space usually merges into one contiguous run;
* pointwise, 2-D tiled: when one access is contiguous along another dim than
  the output (a transpose), rows on `x` and the output's inner dim on `y`, so
  Triton coalesces both sides (it converts layouts through shared memory);
* combo: independent 1-D pointwise kernels of a compiled optimizer step (its
  parameters, compiler/combo_kernels.py) in one launch, each part a range of program
  ids with its own loop (`triton_combo.py`);
* reductions: kept dims on `x` ([XBLOCK, 1]), reduced dims on `r` ([1, RBLOCK]).
  *Persistent* when a row fits in registers (static row <= PERSISTENT_MAX): one
  block holds the whole row and every pass (layernorm's mean, variance and
  normalisation; softmax's max, sum and division) reuses the loaded values.
  *Looped* otherwise: one `for roffset` loop per reduction level, with
  [XBLOCK, RBLOCK] accumulators; full-level values are recomputed from inputs in
  each loop, never read back from what this kernel wrote (no barrier needed).
  Softmax's max and sum fuse into ONE loop as an online reduction (running max,
  rescaled running sum) when the scheduler put them in one kernel; a row's sum
  and its squared deviations (layernorm, var) into one Welford loop (per-lane
  running mean and M2), which also replaces the persistent row where that was
  measured faster (WELFORD_ROWS): there the row's loads carry L2 eviction hints,
  kept for the second read, then let go.

Index expressions: the linear part of each access is split into *runs* of
consecutive dims whose strides chain (stride[outer] == stride[inner]*size[inner]);
a run is one flat variable (`xindex` itself when the run is the whole axis), so
contiguous accesses print as `ptr + xindex` and Triton's alignment analysis
proves 16-byte vector loads (static sizes print as literals; symbolic ones are
int arguments, which Triton specializes on divisibility by 16). Indices are
int32 unless a buffer or the iteration space needs int64.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import sympy
import torch

from fuselens.compiler import ir
from fuselens.compiler.codegen import KernelBuilder, KernelSource, canonical_text, cname, reduction_phases
from fuselens.compiler.codegen.triton_inplace import inplace_candidates
from fuselens.compiler.codegen.triton_emit import Emission, Scope
from fuselens.compiler.codegen.triton_one_loop import OneLoopPasses
from fuselens.compiler.codegen.triton_ops import TL_DTYPES, MathMode, TritonOps, TVal
from fuselens.compiler.runtime.triton_prelude import prelude_header
from fuselens.compiler.codegen.triton_patterns import (drop_dead, online_softmax_pairs, share_sincos,
                                                       welford_pairs)
from fuselens.compiler.ir import ComputeNode, Expr, FloorDiv, GraphIR, ModularIndexing
from fuselens.compiler.kernel_group import KernelGroup

PERSISTENT_MAX = 16384  # static rows up to this many elements stay in registers
COLUMN_PERSISTENT_MAX = 128  # columns up to this long (launch_config keeps 32 of them a block)
MAX_XBLOCK_POINTWISE = 4096  # largest XBLOCK the launcher may pick (mask elision relies on it)
ONE_PROGRAM = 1024  # a pointwise kernel this small is one program under the launch heuristics
MAX_BLOCK_2D = 64
MAX_XBLOCK_REDUCTION = 64
# the key of an access's {dim: stride} that holds the stride of the row a gathered read picks
GATHERED = sympy.Symbol("gathered_row")
MAX_RBLOCK_LOOPED = 2048
# A looped Welford kernel instead of a persistent row when the kernel's only reductions
# are a row's sum and its sum of squared deviations (layernorm, var), only where it was
# measured faster. Layernorm on the H200, Welford / persistent ms (Inductor):
#   fp32 16384x4096 0.1287 / 0.1354 (0.1292)   fp32 32768x4096 0.2516 / 0.2638 (0.2529)
#   fp32 256x4096   0.0086 / 0.0067 (0.0107)   fp32 8192x8192  0.1339 / 0.1334 (0.1318)
#   fp32 4096x16384 0.1519 / 0.1486 (0.1467)   bf16 16384x4096 0.0880 / 0.0703 (0.0962)
# so: float32 rows of 4096-8191 elements, at least 8192 of them (static sizes).
WELFORD_ROWS = (4096, 8191)
WELFORD_MIN_XNUMEL = 8192
INT32_LIMIT = 2**31 - 2**20


@functools.lru_cache(maxsize=8192)  # planning and printing split the same indices; so do a model's layers
def _linear(e: Expr, gv: tuple) -> tuple[tuple, Expr]:
    lin: dict = {}
    rest: Expr = sympy.Integer(0)
    gset = set(gv)
    for t in sympy.Add.make_args(sympy.expand(e)):
        gs = t.free_symbols & gset
        if len(gs) == 1 and not t.has(FloorDiv, ModularIndexing, sympy.Min, sympy.Max):
            g = next(iter(gs))
            c = sympy.cancel(t / g)
            if g not in c.free_symbols:
                lin[g] = lin.get(g, sympy.Integer(0)) + c
                continue
        rest = rest + t
    return tuple(lin.items()), rest


@dataclass
class TritonKernelSource(KernelSource):
    """A KernelSource plus what the launcher needs: the kernel kind and the
    block axes' sizes (sympy over the kernel's symbols)."""

    kernel_kind: str = "pointwise"  # pointwise | pointwise2d | persistent_reduction | looped_reduction | combo
    xnumel: Expr = sympy.Integer(1)
    rnumel: Expr = sympy.Integer(1)  # reduction row length, or the 2-D tile's y extent
    numel_args: list[str] = field(default_factory=list)  # "xnumel"/"rnumel" when passed as arguments
    column_reduction: bool = False  # the rows' contiguous dim is a kept dim (tile wide in x)
    clamped_loads: bool = False  # its big loads are clamped (a cat's branches): index math at every element
    elem_bytes: int = 4  # widest element of the kernel's buffers, of those a reduction streams (block sizing)
    long_math: bool = False  # per-element code of a long helper (sin/cos): one vector a thread
    kind: str = "triton"
    device: str = "cuda"
    buffer_dtypes: list = field(default_factory=list)  # torch dtypes of `buffers` (ahead-of-time compile)
    parts: list[int] = field(default_factory=list)  # combo: each part's elements, in program order


@dataclass
class _Axis:
    name: str  # "x", "y" or "r"
    dims: list[int]  # group dims, outer to inner
    index: str  # the variable holding the flat axis index


_RED_IDENTITY = {"sum": 0, "prod": 1, "any": 0, "all": 1}


def _identity(kind: str, dtype: torch.dtype) -> str:
    if kind in _RED_IDENTITY:
        return repr(float(_RED_IDENTITY[kind])) if dtype.is_floating_point else str(_RED_IDENTITY[kind])
    if dtype.is_floating_point:
        return 'float("-inf")' if kind == "max" else 'float("inf")'
    info = torch.iinfo(dtype)
    return str(info.min if kind == "max" else info.max)


class TritonKernel(Emission, OneLoopPasses, KernelBuilder):
    """Generates the Triton source of one KernelGroup."""

    def __init__(self, group: KernelGroup, graph: GraphIR, options: Any) -> None:
        super().__init__(group, graph, options)
        self.gv = group.gvars()
        self.math = MathMode(interpret=os.environ.get("TRITON_INTERPRET") == "1")
        self.ops = TritonOps(self)
        self.top = Scope([], 1)
        self.scope = self.top
        self.rscope = self.top  # where r/y axis variables live (the loop body when looped)
        self.demote_fp64 = True
        self.masks: dict[str, Optional[str]] = {}
        self.welford: dict[str, ComputeNode] = {}  # {row sum: its sum of squared deviations}
        self.evict: Optional[str] = None  # L2 policy of the row loads the current pass emits
        self.out16 = False  # every buffer this kernel writes is bfloat16/float16 (set by plan)
        self.indirect_in_r: dict[str, bool] = {}  # ops.indirect variable -> read inside the r loop
        # element offsets of each buffer's loads and stores (in-place candidates, triton_inplace.py)
        self.load_offsets: dict[str, set[str]] = {}
        self.store_offsets: dict[str, set[str]] = {}
        self.load_conds: list[str] = []  # conjunctions of the conditions the loads being printed are masked by (masked)
        self.from_data: set[str] = set()  # values computed from a load or a reduction (emit)
        self.zero_d: set[str] = set()  # loads of one element (no block): `is_scalar`
        self.exprs: dict[str, str] = {}  # each printed value's expression (emit)
        # a part of a combo kernel: the name of the program's index within its part
        self.pid_name: Optional[str] = None

    # -- dtypes ---------------------------------------------------------------
    def rep_dtype(self, dtype: torch.dtype) -> torch.dtype:
        if dtype in (torch.bfloat16, torch.float16):
            return torch.float32
        if dtype == torch.float64 and self.demote_fp64:
            return torch.float32
        return dtype

    # -- emission -------------------------------------------------------------
    def note_symbols(self, e: Any) -> None:
        self.symbols |= {s for s in sympy.sympify(e).free_symbols if s in self.graph.symbols or s in self.graph.size_hints}

    # -- index printing -------------------------------------------------------
    def texpr(self, e: Any, names: dict) -> str:
        """A sympy integer expression as Triton/Python source."""
        e = sympy.sympify(e)
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            if e in names:
                return names[e]
            self.note_symbols(e)
            return e.name
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(self.texpr(a, names) for a in e.args) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(self.texpr(a, names) for a in e.args) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + " * ".join([self.texpr(e.base, names)] * int(e.exp)) + ")"
        if isinstance(e, FloorDiv):
            return f"({self.texpr(e.args[0], names)} // {self.texpr(e.args[1], names)})"
        if isinstance(e, ModularIndexing):
            return f"(({self.texpr(e.args[0], names)} // {self.texpr(e.args[1], names)}) % {self.texpr(e.args[2], names)})"
        if isinstance(e, (sympy.Min, sympy.Max)):
            fn = "tl.minimum" if isinstance(e, sympy.Min) else "tl.maximum"
            out = self.texpr(e.args[0], names)
            for a in e.args[1:]:
                out = f"{fn}({out}, {self.texpr(a, names)})"
            return out
        raise NotImplementedError(f"cannot print index expression {e!r} for Triton")

    def simplify(self, e: Any) -> Expr:
        return ir.simplify_index(sympy.sympify(e), self.ranges)

    def linear(self, e: Expr) -> tuple[dict, Expr]:
        """Split an index into {gvar: coefficient} (linear terms) and the rest."""
        lin, rest = _linear(e, tuple(self.gv))
        return dict(lin), rest

    def axis_var(self, axis: _Axis, ia: int, ib: int) -> str:
        """The flat variable of dims ia..ib (positions in axis.dims) of an axis."""
        n = len(axis.dims)
        sizes = [self.g.full[d] for d in axis.dims]
        if ia == 0 and ib == n - 1:
            return axis.index
        inner = ir.numel(sizes[ib + 1:])
        span = ir.numel(sizes[ia:ib + 1])
        e = axis.index
        if inner != 1:
            e = f"({e} // {self.texpr(inner, {})})"
        if ia != 0:
            e = f"({e} % {self.texpr(span, {})})"
        scope = self.top if axis.name == "x" else self.rscope
        return self.emit(e, torch.int64, scope).name

    def index(self, expr: Any) -> tuple[str, set[str]]:
        """Print an index expression over the group's variables; returns the
        source and the names of the axes it depends on."""
        e = self.simplify(expr)
        self.note_symbols(e)
        lin, rest = self.linear(e)
        parts: list[str] = []
        axes: set[str] = set()
        for axis in self.axes:
            coefs = [lin.get(self.gv[d], sympy.Integer(0)) for d in axis.dims]
            j = len(coefs) - 1
            while j >= 0:
                if coefs[j] == 0:
                    j -= 1
                    continue
                ib, c = j, coefs[j]
                ia = j
                stride = c
                while ia - 1 >= 0 and coefs[ia - 1] != 0 and ir.same_expr(coefs[ia - 1], stride * self.g.full[axis.dims[ia]]):
                    stride = coefs[ia - 1]
                    ia -= 1
                var = self.axis_var(axis, ia, ib)
                parts.append(var if c == 1 else f"{self.texpr(c, {})} * {var}")
                axes.add(axis.name)
                j = ia - 1
        if rest != 0:
            names = {}
            for axis in self.axes:
                for pos, d in enumerate(axis.dims):
                    if self.gv[d] in rest.free_symbols:
                        names[self.gv[d]] = self.axis_var(axis, pos, pos)
                        axes.add(axis.name)
            parts.append(self.texpr(rest, names))
        return (" + ".join(parts) if parts else "0"), axes

    def index_with_gathers(self, expr: Any) -> tuple[str, set[str]]:
        """`index`, where an index read from a tensor varies with x (and r, read in the r loop) with
        no block variable in it; one computed from constants alone (bucketize's first probe) does not."""
        s, axes = self.index(expr)
        indirect = [v for v in sympy.sympify(expr).free_symbols if isinstance(v, ir.Indirect)]
        if indirect and not (not axes and all(self.is_scalar(v.name) for v in indirect)):
            axes |= {"x"} | ({"r"} if any(self.indirect_in_r.get(v.name) for v in indirect) else set())
        return s, axes

    def mask_for(self, axes: set[str]) -> Optional[str]:
        ms = [self.masks.get(a) for a in sorted(axes, key=lambda a: a != "x")]
        ms = [m for m in ms if m]
        if not ms:
            return None
        if len(ms) == 1:
            return ms[0]
        return self.emit(" & ".join(ms), torch.bool, self.rscope).name

    # -- memory ---------------------------------------------------------------
    def ptr(self, name: str, write: bool = False) -> str:
        lst = self.writes if write else self.reads
        if name not in lst:
            lst.append(name)
        return ("out_" if write else "in_") + cname(name)

    def load(self, name: str, index: Expr) -> TVal:
        m = self.members.get(name)
        if m is not None:
            v = self.scope.find_value(name)
            if v is not None:
                return v
            if self.g.level(m) == "full":
                return self.compute(m)
            raise RuntimeError(f"{name} used before its reduction finished")
        spec = self.graph.buffers[name]
        # the runtime passes tensors, whose data pointer already includes the storage offset
        idx, axes = self.index_with_gathers(index)
        self.load_offsets.setdefault(name, set()).add(idx)
        mask = self.mask_for(axes)
        src = self._load_source(name, idx, mask, axes, spec.dtype)
        scope = self.scope
        if self.kind == "looped_reduction" and "r" not in axes:
            scope = self.top  # row-constant (weights by row, statistics): hoisted out of the r loop
        if self.load_conds and axes:  # a scalar (no block pointer) takes no block mask, and costs nothing
            loaded = scope.find_cache(src)  # read unmasked already: every lane has it
            if loaded is not None and loaded.dtype == spec.dtype:
                return loaded
            mask = self.load_conds[-1] if not mask else self.emit(f"{mask} & {self.load_conds[-1]}", torch.bool).name
            # the conditions live in the current scope: not hoisted
            return self.emit(self._load_source(name, idx, mask, axes, spec.dtype), spec.dtype)
        v = self.emit(src, spec.dtype, scope)
        if not axes:
            self.zero_d.add(v.name)
        return v

    def _load_source(self, name: str, idx: str, mask: Optional[str], axes: set[str], dtype: torch.dtype) -> str:
        # eviction hints only in Welford kernels (below): measured on the H200 (benchmarks/RESULTS.md),
        # evict_first on the streamed operand made persistent reductions with 1024-wide rows 2x slower
        src = f"tl.load({self.ptr(name)} + ({idx})" + (f", {mask}, other=0" if mask else "")
        if self.evict and "r" in axes:
            # a Welford kernel reads its rows twice: keep them in L2 for the second pass, then
            # let them go; weights (no x axis) are read by every row and stay
            src += f", eviction_policy='{self.evict if 'x' in axes else 'evict_last'}'"
        src += ")"
        rep = self.rep_dtype(dtype)
        if rep != dtype:
            src += f".to({TL_DTYPES[rep]})"
        return src

    def indirect(self, value: TVal, size: Expr) -> Expr:
        """ops.indirect: the value clamped into [0, size) as a variable (codegen/__init__.py)."""
        v = self.emit(f"tl.minimum(tl.maximum(({value}).to(tl.int64), 0), {self.texpr(sympy.sympify(size) - 1, {})})",
                      torch.int64)
        self.indirect_in_r[v.name] = self.scope is not self.top
        return ir.Indirect(v.name, integer=True)

    def compute(self, node: ComputeNode) -> TVal:
        idx = self.g.own_index(node)
        v = node.body(self.ops, idx)
        if v.dtype != node.dtype:
            v = self.ops.to_dtype(v, node.dtype)
        self.scope.values[node.name] = v
        return v

    def store(self, node: ComputeNode, v: TVal, idx: Sequence[Expr], level_axes: set[str]) -> None:
        off, axes = self.index(ir.offset_of(idx, node.stride))
        self.store_offsets.setdefault(node.name, set()).add(off if not level_axes - axes else "broadcast")
        for a in sorted(level_axes - axes):  # a broadcast store (a 0-d result): give the pointer the block's shape
            off = f"{off} + tl.zeros_like({self.axis_index[a]})"
        mask = self.mask_for(level_axes)
        val = v.name
        if node.dtype == torch.bfloat16:
            val = f"_fl_to_bf16({val})"  # rounded to nearest even on every target (the prelude)
        elif self.rep_dtype(node.dtype) != node.dtype:
            val = f"{val}.to({TL_DTYPES[node.dtype]})"
        self.line(f"tl.store({self.ptr(node.name, True)} + ({off}), {val}" + (f", {mask})" if mask else ")"))

    # -- planning -------------------------------------------------------------
    def _phases(self) -> int:
        self.phase.update(reduction_phases(self.g, self.members))
        return max([0, *self.phase.values()])

    def _accesses(self) -> list[tuple[str, dict, bool]]:
        """(buffer, {gvar: stride}, is_store) of every memory access at the full level."""
        out = []
        g = self.g
        for c in g.nodes:
            lvl = g.level(c)
            body_size = c.full_size if c.is_reduction else c.size
            cidx = g.full_index(body_size) if lvl in ("full", "reduction") else g.outer_index(c.size)
            sub = {ir.index_var("d", i): v for i, v in enumerate(cidx)}
            for buf, index in ir.traced_loads(self.graph, c):
                if buf in self.members or buf not in self.graph.buffers:
                    continue
                e = self.simplify(ir.substitute(index, sub))
                lin, rest = self.linear(e)
                gathered = [rest.coeff(v) for v in rest.free_symbols if isinstance(v, ir.Indirect)]
                if gathered:  # the dims that pick the row live inside the read index
                    lin[GATHERED] = max(self._hint(c) for c in gathered)
                out.append((buf, lin, False))
            if c.name in g.stores:
                e = self.simplify(ir.offset_of(g.own_index(c), c.stride))
                out.append((c.name, self.linear(e)[0], True))
        return out

    def _hint(self, e: Any) -> int:
        return self.graph.hint(e)

    def _order(self, dims: list[int], coefs: dict) -> list[int]:
        """Dims outer to inner by descending stride of a reference access. A dim the
        access does not step along linearly is innermost (a broadcast: any order reads it
        alike), but in a gather, where it is a dim that picks the row read (the index
        loaded from it), its stride is the row's: Mixtral's sum over each token's experts
        of rows gathered back into token order ran the tokens innermost, every load and
        store 128 elements from the last."""
        gathered = -self._hint(coefs[GATHERED]) if GATHERED in coefs else 0
        return sorted(dims, key=lambda d: -self._hint(coefs.get(self.gv[d], 0)) if self.gv[d] in coefs else gathered)

    def plan(self) -> None:
        """Choose the kernel's kind, its block axes and its index width from the accesses."""
        g = self.g
        acc = self._accesses()
        self.elem_bytes = max([self.graph.buffers[b].dtype.itemsize for b, _, _ in acc] or [4])
        self.demote_fp64 = not any(self.graph.buffers[b].dtype == torch.float64 for b, _, st in acc if not st)
        loads = [a for a in acc if not a[2]]
        stores = [a for a in acc if a[2]]
        self.column = self.clamped = False
        if g.rflags is None:
            self._plan_pointwise(loads, stores)
        else:
            self._plan_reduction(loads, stores)
        # a pointwise kernel whose every output is a 16-bit float may use shorter math (erf)
        self.out16 = self.kind in ("pointwise", "pointwise2d") and bool(g.stores) and all(
            self.graph.buffers[b].dtype in (torch.bfloat16, torch.float16) for b in g.stores)
        self.axis_index = {a.name: a.index for a in self.axes}
        sizes = {a.name: ir.numel([g.full[d] for d in a.dims]) for a in self.axes}
        self.xnumel = sizes["x"]
        self.rnumel = sizes.get("r", sizes.get("y", sympy.Integer(1)))
        extent = 0
        for b, _, _ in acc:
            spec = self.graph.buffers[b]
            extent = max(extent, self._hint(1 + sum((s - 1) * st for s, st in zip(spec.size, spec.stride))))
        dynamic = not (self.xnumel.is_Integer and self.rnumel.is_Integer)
        total = self._hint(self.xnumel) * self._hint(self.rnumel)
        self.int64 = dynamic or extent >= INT32_LIMIT or total >= INT32_LIMIT

    def _plan_pointwise(self, loads: list, stores: list) -> None:
        """One x axis in the output's memory order, or a 2-D tile where an access is a transpose."""
        g = self.g
        n = len(g.full)
        ref = (stores or loads or [("", {}, True)])[0][1]
        order = self._order(list(range(n)), ref)
        self.kind = "pointwise"
        self.axes = [_Axis("x", order, "xindex")]
        if n < 2:
            return
        inner = order[-1]
        for _, c, _ in loads + stores:
            ci = c.get(self.gv[inner], sympy.Integer(0))
            unit = [d for d in order[:-1] if c.get(self.gv[d]) == 1]
            if ci != 0 and ci != 1 and unit and self._hint(g.full[inner]) >= 16 and self._hint(g.full[unit[0]]) >= 16:
                xdims = [d for d in order[:-1] if d != unit[0]] + [unit[0]]
                self.kind = "pointwise2d"
                self.axes = [_Axis("x", xdims, "xindex"), _Axis("y", [inner], "yindex")]
                return

    def _reduction_reference(self, loads: list, stores: list) -> tuple[list, dict, bool]:
        """The loads by size, biggest first, the access whose strides order the loops, and
        whether the big loads are clamped. The reference is the biggest load, preferring one
        linear in every dim of the kernel. A cat's or a pad's reads are clamped, not linear,
        in the dim they join along; where every big load is such, a store over the whole
        loop stands in. (GPT-2's training backward
        sums the cat of q, k and v gradients over tokens: ordered by a clamped read, the
        column reduction was taken for a row one, 4 columns a program, 0.21 ms a call.)"""
        n = len(self.g.full)

        def size(a: tuple) -> int:
            return self._hint(ir.numel(self.graph.buffers[a[0]].size))

        def covered(a: tuple) -> int:
            return sum(1 for d in range(n) if self.gv[d] in a[1])

        big = sorted(loads, key=lambda a: (-size(a), -covered(a)))
        if not big:
            return big, {}, False
        if covered(big[0]) < n:
            whole = [a for a in stores if covered(a) == n and size(a) >= size(big[0])]
            if whole:
                return big, whole[0][1], True
        return big, big[0][1], False

    def _plan_reduction(self, loads: list, stores: list) -> None:
        """Kept dims on x, reduced dims on r; persistent, looped or Welford (module docstring)."""
        g = self.g
        n = len(g.full)
        kept = [d for d in range(n) if not g.rflags[d]]
        red = [d for d in range(n) if g.rflags[d]]
        big, ref, self.clamped = self._reduction_reference(loads, stores)
        xdims, rdims = self._order(kept, ref), self._order(red, ref)
        self.axes = [_Axis("x", xdims, "xindex"), _Axis("r", rdims, "rindex")]
        # the loop's chunk is sized by what it streams: a value read once a row (a loss's int64
        # label) does not halve it. Phi's cross-entropy backward (bf16 rows of 51200) ran
        # 1024-wide chunks for its labels, 0.50 ms against 0.17 at 2048 (H200)
        streamed = [self.graph.buffers[b].dtype.itemsize for b, c, _ in loads + stores
                    if any(self.gv[d] in c for d in rdims)]
        if streamed:
            self.elem_bytes = max(streamed)
        rn = ir.numel([g.full[d] for d in rdims])
        # a reduction whose reference access is contiguous along a kept dim
        # (BatchNorm statistics over N,H,W of channels-last data, bias and norm-weight gradients)
        self.column = bool(xdims and rdims and ref.get(self.gv[xdims[-1]]) == 1 and ref.get(self.gv[rdims[-1]]) != 1)
        # a persistent column block holds whole columns: past COLUMN_PERSISTENT_MAX rows it is
        # a few columns wide, every load a short piece of a row (BERT's [4096, 768] weight-gradient
        # sums took 0.1 ms each; 784-row partial BatchNorm sums in channels-last, 4 columns of
        # 4 bytes a row, ran at 40% of the H100's bandwidth); looped, it is a tile of several
        # columns and a chunk of rows
        persistent = rn.is_Integer and int(rn) <= (COLUMN_PERSISTENT_MAX if self.column else PERSISTENT_MAX)
        self.kind = "persistent_reduction" if persistent else "looped_reduction"
        xn = ir.numel([g.full[d] for d in xdims])
        row_fp32 = bool(big) and self.graph.buffers[big[0][0]].dtype == torch.float32
        # looped rows always (two reads of the row instead of three); persistent ones where measured
        if not persistent or (row_fp32 and WELFORD_ROWS[0] <= int(rn) <= WELFORD_ROWS[1] and xn.is_Integer
                              and int(xn) >= WELFORD_MIN_XNUMEL):
            self._phases()
            self.welford = welford_pairs(self)
            if self.welford:
                self.kind = "looped_reduction"

    # -- the kernel -----------------------------------------------------------
    def generate(self) -> TritonKernelSource:
        return self._finish(self.emit_body())

    def emit_body(self) -> list[str]:
        """Plan and print the kernel's body; returns the size parameters it takes (`head`)."""
        self.plan()
        g = self.g
        nphases = self._phases() if g.rflags is not None else 0
        head: list[str] = []
        xn = self._numel_src("x", self.xnumel, head)
        rn = self._numel_src("r", self.rnumel, head) if self.kind != "pointwise" else "1"
        pid = self.pid_name or ("tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)")
        if self.kind == "pointwise":
            self.line(f"xoffset = {pid} * XBLOCK")
            self.line("xindex = xoffset + tl.arange(0, XBLOCK)")
            self._mask("x", xn, self.xnumel, MAX_XBLOCK_POINTWISE)
            self._body_pointwise({"x"})
        elif self.kind == "pointwise2d":
            self.line(f"pid = {pid}")
            self.line(f"ytiles = tl.cdiv({rn}, YBLOCK)")
            self.line("xindex = (pid // ytiles) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
            self.line("yindex = (pid % ytiles) * YBLOCK + tl.arange(0, YBLOCK)[None, :]")
            self._mask("x", xn, self.xnumel, MAX_BLOCK_2D)
            self._mask("y", rn, self.rnumel, MAX_BLOCK_2D)
            self._body_pointwise({"x", "y"})
        else:
            self.line(f"xoffset = {pid} * XBLOCK")
            self.line("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
            self._mask("x", xn, self.xnumel, MAX_XBLOCK_REDUCTION)
            if self.kind == "persistent_reduction":
                self.line("rindex = tl.arange(0, RBLOCK)[None, :]")
                rpow2 = self.rnumel.is_Integer and int(self.rnumel) > 0 and (int(self.rnumel) & (int(self.rnumel) - 1)) == 0
                self._mask("r", rn, self.rnumel, int(self.rnumel) if rpow2 else 0)
            self._body_reduction(nphases)
        return head

    def _numel_src(self, axis: str, numel: Expr, head: list[str]) -> str:
        name = "xnumel" if axis == "x" else ("ynumel" if self.kind == "pointwise2d" else "rnumel")
        if numel.is_Integer:
            self.line(f"{name} = {int(numel)}")
        else:
            self.note_symbols(numel)
            head.append(name)
        return name

    def _mask(self, axis: str, numel_name: str, numel: Expr, max_block: int) -> None:
        idx = self.axis_index[axis]
        if numel.is_Integer and max_block and int(numel) % max_block == 0:
            self.masks[axis] = None  # every block size the launcher picks divides the extent: no mask
            self.line(f"# {axis}numel is a multiple of every {axis.upper()}BLOCK: no {axis} mask")
            return
        self.line(f"{axis}mask = {idx} < {numel_name}")
        self.masks[axis] = f"{axis}mask"

    def _body_pointwise(self, level_axes: set[str]) -> None:
        # One program (a compiled optimizer's step counts: 64 of them, 0-d, side by side): the
        # stores go last. Each store waits for its value's load, and a later load may not pass an
        # earlier store (the pointers may alias), so interleaved they made one memory round trip
        # after another, with no other program to hide them (GPT-2's AdamW: 23 us for one kernel).
        one_program = self.kind == "pointwise" and self.xnumel.is_Integer and int(self.xnumel) <= ONE_PROGRAM
        later = []
        for n in self.g.nodes:
            if n.name in self.g.stores:
                v = self.scope.find_value(n.name) or self.compute(n)
                if one_program:
                    later.append((n, v))
                else:
                    self.store(n, v, self.g.own_index(n), level_axes)
        for n, v in later:
            self.store(n, v, self.g.own_index(n), level_axes)

    def _body_reduction(self, nphases: int) -> None:
        g = self.g
        outer_nodes = [n for n in g.nodes if g.level(n) == "outer"]
        self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == -1])
        online = online_softmax_pairs(self) if self.kind == "looped_reduction" else {}
        welford = self.welford if self.kind == "looped_reduction" else {}
        skip_phase: set[int] = set()
        for p in range(nphases + 1):
            if p in skip_phase:
                self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == p])
                continue
            reds = [n for n in g.nodes if n.is_reduction and self.phase[n.name] == p]
            fulls = [n for n in g.nodes if g.level(n) == "full" and self.phase[n.name] == p and n.name in g.stores]
            if not reds and not fulls:
                self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == p])
                continue
            pairs = [(r, online[r.name]) for r in reds if r.name in online]
            if pairs and not fulls and len(reds) == 1:
                # max in this pass, the sum of exp(x - max) that needs it in the next: one online pass
                mx, sm = pairs[0]
                self._online_pass(mx, sm)
                self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == p])
                skip_phase.add(p + 1)
                # the sum's phase holds nothing else (checked by online_softmax_pairs)
                continue
            if reds and not fulls and all(r.name in welford for r in reds):
                # the row sums here and the squared deviations the next pass would take: one Welford loop
                groups: dict[str, tuple[ComputeNode, list[ComputeNode]]] = {}
                for r in reds:
                    groups.setdefault(welford[r.name].name, (welford[r.name], []))[1].append(r)
                lanes = self._welford_pass([sums for _, sums in groups.values()])
                self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == p])
                for (q, sums), (lane_m, lane_m2, lane_n) in zip(groups.values(), lanes):
                    self._finish_welford_q(sums[0], q, lane_m, lane_m2, lane_n)
                skip_phase.add(p + 1)
                self.evict = "evict_first"  # the passes after this one read the rows for the last time
                continue
            if self.kind == "persistent_reduction":
                for n in fulls:
                    v = self.scope.find_value(n.name) or self.compute(n)
                    self.store(n, v, g.own_index(n), {"x", "r"})
                for r in reds:
                    self._persistent_reduce(r)
            else:
                self._looped_pass(reds, fulls)
            self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == p])

    def _outer_epilogue(self, nodes: Sequence[ComputeNode]) -> None:
        for n in nodes:
            v = self.scope.find_value(n.name) or self.compute(n)
            if n.name in self.g.stores:
                self.store(n, v, self.g.outer_index(n.size), {"x"})

    def _red_input(self, r: ComputeNode) -> tuple[TVal, torch.dtype]:
        v = r.body(self.ops, self.g.full_index(r.full_size))
        if v.dtype != r.acc_dtype:
            v = self.ops.to_dtype(v, r.acc_dtype)
        rep = self.rep_dtype(r.acc_dtype)
        if r.reduction in ("any", "all") or rep == torch.bool:
            rep = torch.int32
            v = self.emit(f"({v} != 0).to(tl.int32)", r.acc_dtype)
        return v, rep

    def _combine(self, kind: str, rep: torch.dtype) -> tuple[str, str]:
        """(block reduction of `{v}` along axis 1, elementwise combine of `{a}`, `{b}`)."""
        fl = rep.is_floating_point
        if kind == "sum":
            return "tl.sum({v}, 1)", "{a} + {b}"
        if kind == "prod":
            return "tl.reduce({v}, 1, _fl_prod)", "{a} * {b}"
        if kind in ("max", "any"):
            return ("tl.reduce({v}, 1, _fl_maximum)" if fl else "tl.max({v}, 1)",
                    "_fl_maximum({a}, {b})" if fl else "_fl_imaximum({a}, {b})")
        return ("tl.reduce({v}, 1, _fl_minimum)" if fl else "tl.min({v}, 1)",
                "_fl_minimum({a}, {b})" if fl else "_fl_iminimum({a}, {b})")

    def _finish_red(self, r: ComputeNode, res: str, rep: torch.dtype) -> None:
        if r.reduction in ("any", "all") or r.acc_dtype == torch.bool:
            v = self.emit(f"({res} != 0)", torch.bool, self.top)
        else:
            v = self.emit(res, r.acc_dtype, self.top)
        if v.dtype != r.dtype:
            saved, self.scope = self.scope, self.top
            v = self.ops.to_dtype(v, r.dtype)
            self.scope = saved
        self.top.values[r.name] = v
        if r.name in self.g.stores:
            saved, self.scope = self.scope, self.top
            self.store(r, v, self.g.outer_index(r.size), {"x"})
            self.scope = saved

    def _masked(self, v: TVal, ident: str) -> str:
        m = self.mask_for({"x", "r"})
        if m is None:
            return f"tl.broadcast_to({v}, [XBLOCK, RBLOCK])"
        return f"tl.where({m}, {v}, {ident})"

    def _persistent_reduce(self, r: ComputeNode) -> None:
        v, rep = self._red_input(r)
        red, _ = self._combine(r.reduction, rep)
        ident = _identity(r.reduction, rep)
        vm = self.emit(self._masked(v, ident), r.acc_dtype)
        self._finish_red(r, red.format(v=vm) + "[:, None]", rep)

    def _open_loop(self) -> Scope:
        """A loop over the row in RBLOCK chunks. Its lines are kept apart and
        placed after whatever gets hoisted to the top scope meanwhile."""
        loop = Scope([], self.top.indent + 1, parent=self.top)
        self.scope = self.rscope = loop
        self.line("rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
        rstatic = self.rnumel.is_Integer and int(self.rnumel) % MAX_RBLOCK_LOOPED == 0
        if rstatic:
            self.masks["r"] = None
        else:
            self.line("rmask = rindex < rnumel")
            self.masks["r"] = "rmask"
        return loop

    def _close_loop(self, loop: Scope, tail: Sequence[str] = ()) -> None:
        self.scope = self.rscope = self.top
        self.line("for roffset in range(0, rnumel, RBLOCK):")
        self.top.lines.extend(loop.lines)
        self.top.lines.extend(f"{'    ' * loop.indent}{t}" for t in tail)

    def _looped_pass(self, reds: Sequence[ComputeNode], fulls: Sequence[ComputeNode]) -> None:
        accs = []
        for r in reds:
            rep = torch.int32 if r.reduction in ("any", "all") or r.acc_dtype == torch.bool else self.rep_dtype(r.acc_dtype)
            self.counter += 1
            a = f"acc{self.counter}"
            self.line(f"{a} = tl.full([XBLOCK, RBLOCK], {_identity(r.reduction, rep)}, {TL_DTYPES[rep]})")
            accs.append((r, a, rep))
        loop = self._open_loop()
        for n in fulls:
            v = self.scope.find_value(n.name) or self.compute(n)
            self.store(n, v, self.g.own_index(n), {"x", "r"})
        for r, a, rep in accs:
            v, _ = self._red_input(r)
            _, comb = self._combine(r.reduction, rep)
            vm = self._masked(v, _identity(r.reduction, rep))
            self.line(f"{a} = " + comb.format(a=a, b=vm))
        self._close_loop(loop)
        for r, a, rep in accs:
            red, _ = self._combine(r.reduction, rep)
            self._finish_red(r, red.format(v=a) + "[:, None]", rep)

    # -- the function ---------------------------------------------------------
    def _finish(self, head: list[str]) -> TritonKernelSource:
        name = self.g.name
        reads = [b for b in self.reads if b not in self.writes]
        params = [f"in_{cname(b)}" for b in reads] + [f"out_{cname(b)}" for b in self.writes]
        syms = sorted(self.symbols, key=lambda s: s.name)
        params += [s.name for s in syms] + head
        blocks = {"pointwise": ["XBLOCK"], "pointwise2d": ["XBLOCK", "YBLOCK"]}.get(self.kind, ["XBLOCK", "RBLOCK"])
        params += [f"{b}: tl.constexpr" for b in blocks]
        doc = f'    """{self.kind}: {" ".join(self._describe())}"""'
        lines = self.body_lines()
        src = "@triton.jit\n" + f"def {name}({', '.join(params)}):\n" + doc + "\n" + "\n".join(lines) + "\n"
        buffers = reads + list(self.writes)
        nbytes = sum(self.graph.nbytes(b) for b in buffers)
        return TritonKernelSource(
            name=name, source=src, buffers=buffers, outputs=list(self.writes), symbols=syms, bytes_accessed=nbytes,
            language="python", kernel_kind=self.kind, xnumel=self.xnumel, rnumel=self.rnumel, numel_args=head,
            column_reduction=self.column, clamped_loads=self.clamped, elem_bytes=self.elem_bytes,
            device="cpu" if self.math.interpret else "cuda",
            buffer_dtypes=[self.graph.buffers[b].dtype for b in buffers], long_math=bool(_LONG_MATH.search(src)),
            inplace=inplace_candidates(self, lines))

    def body_lines(self) -> list[str]:
        """The printed body, dead values dropped."""
        lines = drop_dead(self.top.lines)
        return lines if not self.demote_fp64 else share_sincos(lines)

    def _describe(self) -> list[str]:
        out = []
        for a in self.axes:
            out.append(f"{a.name}={ir.format_sizes([self.g.full[d] for d in a.dims])}")
        if self.column:
            out.append("(columns: contiguous along x)")
        if self.int64:
            out.append("int64 indexing")
        return out


_LONG_MATH = re.compile(r"\b_fl_(?:sincos|sin|cos)\(")


def generate(group: KernelGroup, graph: GraphIR, options: Any) -> TritonKernelSource:
    """The Triton source of one kernel (a `@triton.jit` function; `library_source` adds the prelude)."""
    from fuselens.compiler.combo_kernels import ComboGroup

    if isinstance(group, ComboGroup):
        from fuselens.compiler.codegen.triton_combo import generate_combo

        return generate_combo(group, graph, options)
    with TritonKernel(group, graph, options) as kernel:
        return kernel.generate()


def canonical_source(ks: KernelSource) -> str:
    return canonical_text(ks.source, ks.name, r"\b(?:in|out)_\w+")


def alias_source(ks: KernelSource, same: KernelSource) -> str:
    """`ks` as a second name of the identical kernel `same`: one JITFunction, so one
    compile per specialization for both."""
    return f"{ks.name} = {same.name}\n"


def library_source(kernels: Sequence[KernelSource]) -> str:
    """One Python module: the helper prelude's names, then every kernel of the graph.
    The prelude is a module of its own next to it (triton_prelude.load_prelude),
    imported once per process: its ~40 jit functions cost ~10 ms to build, in the
    parent and again in each compile worker, for every graph."""
    mode = MathMode(interpret=os.environ.get("TRITON_INTERPRET") == "1")
    return prelude_header(mode.prelude()) + "\n\n" + "\n\n".join(k.source for k in kernels)
