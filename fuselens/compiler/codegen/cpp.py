"""C++/OpenMP code generation: one `extern "C"` function per KernelGroup.

Loop structure of a kernel over full space F with reduced dims R:

    #pragma omp parallel for collapse(k) if(work >= parallel_threshold)
    for outer dims (g0, g1, ...)              // kept dims of F, one row each
      outer-level values that need no reduction
      for each pass p = 0..P:                 // one pass per reduction dependency level
        init accumulators of pass p
        #pragma omp simd reduction(...)       // innermost reduced dim, vectorized
        for reduced dims: full-level values, stores, accumulator updates
        finish accumulators, outer-level epilogues, their stores

A pointwise kernel is the same with its last dim as the inner (simd) loop; a
1-D one is split into parallel chunks. Values are emitted once per scope
(common subexpressions are shared by a cache keyed on the C expression).
g++ 12 vectorizes the simd loops (see `-fopt-info-vec` notes in runtime/cpp_build.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import sympy
import torch

from fuselens.compiler import index_bounds, ir
from fuselens.compiler.codegen import KernelBuilder, KernelSource, canonical_text, cname, reduction_phases
from fuselens.compiler.codegen.cpp_ops import CTYPES, HALVES, CppOps, CVal, cconst, cexpr, storage_ctype
from fuselens.compiler.codegen.cpp_scratch import RowScratch
from fuselens.compiler.ir import ComputeNode, Expr, GraphIR
from fuselens.compiler.kernel_group import KernelGroup

_IDENT = re.compile(r"[A-Za-z_]\w*")
_TEMP = re.compile(r"t\d+")

CHUNK = 4096  # elements per parallel chunk of a 1-D pointwise kernel
_RED_INIT = {"sum": "0", "prod": "1", "any": "0", "all": "1"}
_RED_OMP = {"sum": "+", "prod": "*", "max": "max", "min": "min", "any": "|", "all": "&"}


@dataclass
class _LoopNest:
    """The loops of one kernel being printed: what every row pass needs of them."""

    body: list[str]
    ind: int  # indentation of a row pass inside the outer loops
    inner_dims: list[int]
    chunked: bool  # a 1-D pointwise space split into CHUNK-sized parallel pieces
    rn: Any  # elements in a row (the inner dims)
    short_rows: bool  # rows short enough for float sums (FLOAT_SUM_MAX)


@dataclass
class _Scope:
    lines: list[str]
    cache: dict[str, CVal] = field(default_factory=dict)
    values: dict[str, CVal] = field(default_factory=dict)  # member name -> value in this scope
    indent: int = 0
    stored: set[str] = field(default_factory=set)  # buffers this body has stored to so far


class CppKernel(RowScratch, KernelBuilder):
    """Generates the C++ function of one KernelGroup."""

    def __init__(self, group: KernelGroup, graph: GraphIR, options: Any) -> None:
        super().__init__(group, graph, options)
        self.scope: _Scope = _Scope([])
        self.outer_scope: Optional[_Scope] = None
        self.current_phase = 0
        self.ops = CppOps(self)
        self.bytes = 0
        self.scratch: dict[str, int] = {}
        self.scratch_home: dict[str, str] = {}  # scratch kept in an output row: name -> C lvalue
        self.inner_dims: list[int] = []
        # C offsets each buffer is loaded / stored at (in-place reuse needs them equal)
        self.load_offsets: dict[str, set[str]] = {}
        self.store_offsets: dict[str, set[str]] = {}
        # (output, input) where the body loads the input after storing the output:
        # writing that output over that input would overwrite elements not yet loaded
        self.load_after_store: set[tuple[str, str]] = set()
        self.outer_names: set[str] = set()  # values defined outside the inner loop
        self.hoist_from: Optional[_Scope] = None  # a row pass's loop, whose invariants go before it
        self.inner_vars: set[str] = set()  # that loop's variables
        self.hoisted: set[str] = set()  # values moved before it (outer_names has them too)
        self.written = {f"b_{cname(n)}" for n in self.g.stores}  # pointers this kernel stores through
        self.widened: dict[str, CVal] = {}  # float64 value -> the float32 value it converts
        self.rounded: set[str] = set()  # bfloat16 values known to be representable
        self.unrounded: dict[str, CVal] = {}  # rounded value -> the float it rounds
        # float32 sin/cos arguments of the vectorized loop being emitted (None: not in one)
        self.trig_args: Optional[list[str]] = None
        self.trig_redo = False  # some loop redoes its block for large sin/cos arguments
        self.index_of: dict[str, Expr] = {}  # integer value -> the index expression it holds
        # the inclusive range of every loop variable while a piece of a split loop is printed
        # (None: not in one), and the split points found for the inner loop's variable
        self.pieces: Optional[dict] = None
        self.split_var: Optional[sympy.Symbol] = None
        self.split_points: set[int] = set()

    # -- helpers used by CppOps
    def simplify(self, e: Expr) -> Expr:
        e = ir.simplify_index(sympy.sympify(e), self.ranges)
        if self.pieces is not None:
            e = index_bounds.fold_clamps(e, self.pieces)
        self.symbols |= {s for s in e.free_symbols if s in self.graph.symbols or s in self.graph.size_hints}
        return e

    def cx(self, e: Expr) -> str:
        """Print a size expression, noting the symbols it needs as arguments."""
        return cexpr(self.simplify(e))

    def emit(self, expr: str, dtype: torch.dtype) -> CVal:
        hit = self.scope.cache.get(expr)
        if hit is not None and hit.dtype == dtype:
            return hit
        if self.outer_scope is not None:
            hit = self.outer_scope.cache.get(expr)
            if hit is not None and hit.dtype == dtype:
                return hit
        self.counter += 1
        v = CVal(f"t{self.counter}", dtype)
        hoist = self._loop_invariant(expr)
        scope = self.outer_scope if hoist else self.scope
        scope.lines.append(f"{'  ' * scope.indent}const {CTYPES[dtype]} {v} = {expr};")
        scope.cache[expr] = v
        if scope is self.outer_scope:
            self.outer_names.add(v.name)
        if hoist:
            self.hoisted.add(v.name)
        return v

    def fold_compare(self, op: str, a: CVal, b: CVal) -> Optional[bool]:
        """A comparison of two index values that the current piece of a split loop decides;
        one that a split of the inner loop would decide is noted as its split point."""
        ea, eb = self.index_of.get(a.name), self.index_of.get(b.name)
        if ea is None or eb is None:
            return None
        if self.pieces is not None:
            return index_bounds.decide(op, ea, eb, self.pieces)
        if self.split_var is not None:
            at = index_bounds.flip_point(op, ea, eb, self.split_var)
            if at is not None:
                self.split_points.add(at)
        return None

    def _loop_invariant(self, expr: str) -> bool:
        """Whether `expr`, met in a row pass's inner loop, reads no loop variable, no value of
        the loop and nothing this kernel writes: computed once before it. An embedding's row
        index read in the loop made g++ gather every element (RMSNorm at half Inductor's speed)."""
        if self.hoist_from is not self.scope or self.outer_scope is None:
            return False
        for tok in _IDENT.findall(expr):
            if tok in self.inner_vars or tok in self.written or tok.startswith(("scr_", "acc")):
                return False
            if _TEMP.fullmatch(tok) and tok not in self.outer_names:
                return False
        return True

    def ptr(self, name: str, write: bool = False) -> str:
        lst = self.writes if write else self.reads
        if name not in lst:
            lst.append(name)
        return f"b_{cname(name)}"

    def load(self, name: str, index: Expr) -> CVal:
        m = self.members.get(name)
        if m is not None:
            for sc in (self.scope, self.outer_scope):
                if sc is not None and name in sc.values:
                    return sc.values[name]
            lvl = self.g.level(m)
            if name in self.scratch and self.phase[name] < self.current_phase:
                return self.emit(self.scratch_ref(name), m.dtype)
            if lvl == "full" and not (name in self.g.stores and self.phase[name] < self.current_phase):
                return self.compute(m)
            if lvl != "full":
                raise RuntimeError(f"{name} used before its reduction finished")
        spec = self.graph.buffers[name]
        off = cexpr(self.simplify(index))
        self.load_offsets.setdefault(name, set()).add(off)
        self.load_after_store.update((o, name) for o in self.scope.stored)
        if spec.dtype in HALVES:
            v = self.emit(f"fl_from_{HALVES[spec.dtype]}({self.ptr(name)}[{off}])", spec.dtype)
            self.rounded.add(v.name)
            return v
        return self.emit(f"{self.ptr(name)}[{off}]", spec.dtype)

    def indirect(self, value: CVal, size: Expr) -> Expr:
        """ops.indirect: the value clamped into [0, size) as a variable (codegen/__init__.py)."""
        v = self.emit(f"fl_imin(fl_imax(static_cast<int64_t>({value}), 0), "
                      f"{cexpr(sympy.sympify(size) - 1)})", torch.int64)
        return ir.Indirect(v.name, integer=True)

    def compute(self, node: ComputeNode) -> CVal:
        """The value of a full- or outer-level member at the current iteration."""
        idx = self.g.own_index(node)
        v = node.body(self.ops, idx)
        if v.dtype != node.dtype:
            v = self.ops.to_dtype(v, node.dtype)
        v = self.ops.round_to(v, node.dtype)  # a bfloat16 op's result, rounded as eager's is
        self.scope.values[node.name] = v
        return v

    def store(self, node: ComputeNode, v: CVal, idx: Sequence[Expr]) -> None:
        off = cexpr(self.simplify(ir.offset_of(idx, node.stride)))
        self.store_offsets.setdefault(node.name, set()).add(off)
        self.scope.stored.add(node.name)
        val = str(v)
        if node.dtype in HALVES:  # to its 16 bits; a loaded or cast bfloat16 value is its top half
            src = self.unrounded.get(v.name)
            exact = v.name in self.rounded and src is None
            val = f"fl_bits_{HALVES[node.dtype]}({v})" if exact else f"fl_to_{HALVES[node.dtype]}({src or v})"
        self.scope.lines.append(f"{'  ' * self.scope.indent}{self.ptr(node.name, True)}[{off}] = {val};")

    # -- phases
    def _phases(self) -> int:
        self.phase.update(reduction_phases(self.g, self.members))
        return max([0, *self.phase.values()])

    # -- the function
    def generate(self) -> KernelSource:
        g = self.g
        nphases = self._phases()
        column = self._column_dim() if nphases == 0 else None
        if column is not None:
            return self._generate_columns(column)
        outer_dims, inner_dims = self._split_dims()
        self._choose_scratch(inner_dims)
        rn = ir.numel([g.full[d] for d in inner_dims])
        nest = _LoopNest(
            body=[], ind=1, inner_dims=inner_dims, chunked=bool(g.rflags is None and not outer_dims and inner_dims),
            rn=rn, short_rows=g.rflags is not None and rn.is_Integer and int(rn) <= self.FLOAT_SUM_MAX)
        self._open_outer_loops(nest, outer_dims)
        self.outer_scope = _Scope(nest.body, indent=nest.ind)
        self.scope = self.outer_scope
        for n, size in self.scratch.items():
            if n in self.scratch_home:
                continue
            nest.body.append(f"{'  ' * nest.ind}{CTYPES[self.members[n].dtype]} scr_{cname(n)}[{size}];")
        outer_nodes = [n for n in g.nodes if g.level(n) == "outer"]
        # outer-level values that need no reduction
        self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == -1])
        for p in range(nphases + 1):
            self.current_phase = p
            reds = [n for n in g.nodes if n.is_reduction and self.phase[n.name] == p]
            fulls = [n for n in g.nodes if g.level(n) == "full" and self.phase[n.name] == p and
                     (n.name in g.stores or n.name in self.scratch)]
            if reds or fulls:
                self._row_pass(nest, reds, fulls, p)
            self._outer_epilogue([n for n in outer_nodes if self.phase[n.name] == p])
        nest.body.append(f"{'  ' * (nest.ind - 1)}}}")
        return self._finish(nest.body)

    # kept elements one program of a column reduction accumulates side by side (stack arrays)
    COLUMN_BLOCK = 64

    def _column_dim(self) -> Optional[int]:
        """The kept dim a one-pass sum kernel should vectorize along instead of its reduced
        dims: the one its biggest input is contiguous in, when that input's reduced dims are
        not (the squeeze-excitation mean over H and W of a channels-last tensor, a bias
        gradient's sum over tokens). Looping the reduced dims innermost would read one
        float a cache line, unvectorized (EfficientNet-B0's first one: 3.6 ms for 590K floats)."""
        g = self.g
        reds = [n for n in g.nodes if n.is_reduction]
        if not reds or any(r.reduction != "sum" or not r.acc_dtype.is_floating_point for r in reds):
            return None
        if any(g.level(n) == "outer" and self.phase[n.name] < 0 for n in g.nodes):
            return None  # a per-row value the loop body would read before the row's pass
        best, coef = -1, None
        for c in g.nodes:
            if g.level(c) == "outer":
                continue
            cidx = g.full_index(c.full_size if c.is_reduction else c.size)
            sub = {ir.index_var("d", i): v for i, v in enumerate(cidx)}
            for buf, index in ir.traced_loads(self.graph, c):
                if buf in self.members or buf not in self.graph.buffers:
                    continue
                size = self.graph.hint(ir.numel(self.graph.buffers[buf].size))
                if size <= best:
                    continue
                cs = self._strides_in(ir.substitute(index, sub))
                if cs is not None:
                    best, coef = size, cs
        if coef is None:
            return None
        unit = [d for d in range(len(g.full)) if coef[d] == 1 and g.full[d] != 1]
        if len(unit) != 1 or g.rflags[unit[0]] or not sympy.sympify(g.full[unit[0]]).is_Integer:
            return None
        reduced = [d for d in range(len(g.full)) if g.rflags[d] and g.full[d] != 1]
        if not reduced or any(coef[d] <= 1 for d in reduced):
            return None
        return unit[0]

    def _generate_columns(self, k: int) -> KernelSource:
        """A one-pass sum kernel vectorized along kept dim `k` (`_column_dim`): blocks of
        COLUMN_BLOCK columns, one accumulator each, the reduced dims looped outside them;
        the sums' epilogue and stores in a loop over the block after the rows."""
        g = self.g
        gv = g.gvars()
        kv, kn = gv[k], int(g.full[k])
        block = min(kn, self.COLUMN_BLOCK)
        others = [d for d in range(len(g.full)) if not g.rflags[d] and d != k]
        reduced = [d for d in range(len(g.full)) if g.rflags[d]]
        threads = self.opt.resolved_threads()
        body = [f"  #pragma omp parallel for collapse({len(others) + 1}) "
                f"if({self.cx(ir.numel(g.full))} >= {self.opt.parallel_threshold}) num_threads({threads})"]
        ind = 1
        for d in others:
            body.append(f"{'  ' * ind}for (int64_t {gv[d]} = 0; {gv[d]} < {self.cx(g.full[d])}; {gv[d]}++)")
            ind += 1
        body.append(f"{'  ' * ind}for (int64_t kb = 0; kb < {kn}; kb += {block})")
        body.append(f"{'  ' * ind}{{")
        ind += 1
        span = f"for (int64_t {kv} = kb; {kv} < std::min<int64_t>(kb + {block}, {kn}); {kv}++)"
        self.outer_scope = None
        self.trig_args = None  # sin/cos take their accurate path: no block is redone
        loop_lines: list[str] = []
        self.scope = _Scope(loop_lines, indent=ind + len(reduced) + 1)
        self._compute_fulls([n for n in g.nodes if g.level(n) == "full" and n.name in g.stores])
        reds = [n for n in g.nodes if n.is_reduction]
        accs = self._acc_names(reds)
        cells = [f"{a}[{kv} - kb]" for a in accs]
        for r, cell in zip(reds, cells):
            v = r.body(self.ops, g.full_index(r.full_size))
            v = v if v.dtype == r.acc_dtype else self.ops.to_dtype(v, r.acc_dtype)
            loop_lines.extend(self._accumulate(r, cell, v, self.scope.indent))
        for r, a in zip(reds, accs):
            t = CTYPES[r.acc_dtype]
            body.append(f"{'  ' * ind}{t} {a}[{block}];")
            body.append(f"{'  ' * ind}for (int64_t j = 0; j < {block}; j++) {a}[j] = {_RED_INIT['sum']};")
        for n, d in enumerate(reduced):
            body.append(f"{'  ' * (ind + n)}for (int64_t {gv[d]} = 0; {gv[d]} < {self.cx(g.full[d])}; {gv[d]}++)")
        pad = "  " * (ind + len(reduced))
        body += [f"{pad}#pragma omp simd", f"{pad}{span}", f"{pad}{{", *loop_lines, f"{pad}}}"]
        result_lines: list[str] = []
        self.scope = _Scope(result_lines, indent=ind + 1)
        self._reduction_results(reds, cells, {}, {})
        self._outer_epilogue([n for n in g.nodes if g.level(n) == "outer"])
        body += [f"{'  ' * ind}{span}", f"{'  ' * ind}{{", *result_lines, f"{'  ' * ind}}}"]
        body.append(f"{'  ' * (ind - 1)}}}")
        return self._finish(body)

    def _split_dims(self) -> tuple[list[int], list[int]]:
        """The dims the parallel outer loops run over, and those of the inner (simd) loop."""
        g = self.g
        nfull = len(g.full)
        if g.rflags is None:
            order = self._stored_order()
            return order[:-1], order[-1:]
        return [d for d in range(nfull) if not g.rflags[d]], [d for d in range(nfull) if g.rflags[d]]

    def _stored_order(self) -> list[int]:
        """A pointwise kernel's dims, outer to inner, in the order its first stored buffer is
        laid out, so that the simd loop walks memory contiguously (channels-last: the channels
        innermost); the logical order where that buffer's is, or its offset is not linear."""
        g = self.g
        logical = list(range(len(g.full)))
        stored = [c for c in g.nodes if c.name in g.stores]
        if len(logical) < 2 or not stored:
            return logical
        coef = self._strides_in(ir.offset_of(g.own_index(stored[0]), stored[0].stride))
        if coef is None:
            return logical
        order = sorted(logical, key=lambda d: (g.full[d] != 1, -coef[d]))  # size-1 dims outermost
        return logical if order[-1] == logical[-1] or coef[order[-1]] != 1 else order

    def _strides_in(self, offset: Expr) -> Optional[list[int]]:
        """The stride of each of the kernel's loop variables in a buffer offset, or None
        where the offset is not a constant-stride sum of them (a clamp, a division)."""
        gv = self.g.gvars()
        e = sympy.expand(self.simplify(offset))
        coef = [e.coeff(v) for v in gv]
        if not all(c.is_Integer for c in coef) or sympy.expand(e - sum(c * v for c, v in zip(coef, gv))).free_symbols & set(gv):
            return None
        return [int(c) for c in coef]

    def _open_outer_loops(self, nest: "_LoopNest", outer_dims: Sequence[int]) -> None:
        """The OpenMP-parallel loops (or chunks of a 1-D pointwise space) around the row passes."""
        g, body = self.g, nest.body
        gv = g.gvars()
        threads = self.opt.resolved_threads()
        par_if = f"if({self.cx(ir.numel(g.full))} >= {self.opt.parallel_threshold}) num_threads({threads})"
        if nest.chunked:
            body.append(f"  #pragma omp parallel for {par_if}")
            body.append(f"  for (int64_t c0 = 0; c0 < {self.cx(g.full[0])}; c0 += {CHUNK}) {{")
            nest.ind = 2
        elif outer_dims:
            coll = f" collapse({len(outer_dims)})" if len(outer_dims) > 1 else ""
            body.append(f"  #pragma omp parallel for{coll} {par_if}")
            for k, d in enumerate(outer_dims):
                body.append(f"{'  ' * (1 + k)}for (int64_t {gv[d]} = 0; {gv[d]} < {self.cx(g.full[d])}; {gv[d]}++)")
            nest.ind = 1 + len(outer_dims)
            body.append(f"{'  ' * (nest.ind - 1)}{{")
        else:
            body.append("  {")

    def _row_pass(self, nest: "_LoopNest", reds: list[ComputeNode], fulls: list[ComputeNode], p: int) -> None:
        """One simd loop over the inner dims: the full-level values of pass `p` and its reductions."""
        ind, inner_dims = nest.ind, nest.inner_dims
        accs = self._acc_names(reds)
        loop_lines: list[str] = []
        saved = self.scope
        self.scope = _Scope(loop_lines, indent=ind + len(inner_dims) + (1 if nest.chunked else 0))
        gv = self.g.gvars()
        self.hoist_from, self.inner_vars = self.scope, {str(gv[d]) for d in inner_dims} | {"c0"}
        self.trig_args = [] if inner_dims else None
        splittable = not reds and len(inner_dims) == 1 and not nest.chunked and nest.rn.is_Integer
        self.split_var, self.split_points = (gv[inner_dims[0]] if splittable else None), set()
        self._compute_fulls(fulls)
        var, self.split_var = self.split_var, None
        pieces = self._split_pieces(fulls, var, int(nest.rn)) if var is not None and not self.trig_args else None
        vals = []
        for r in reds:
            v = r.body(self.ops, self.g.full_index(r.full_size))
            vals.append(v if v.dtype == r.acc_dtype else self.ops.to_dtype(v, r.acc_dtype))
        alias = self._shared_accumulators(reds, accs, vals)
        moments = self._float_moments(reds, accs, vals, alias, nest.short_rows)
        decls = self._accumulations(reds, accs, vals, alias, moments, nest.short_rows, loop_lines)
        trig, self.trig_args = self.trig_args or [], None
        self.hoist_from = None
        flag = f"fl_trig_max{p}" if trig else ""
        redo_lines = list(loop_lines)  # the loop body before the check is added
        if flag:
            # the largest |argument| (a max reduction: one vmaxps a vector, cheaper
            # than an or-ed compare); NaN never wins it
            pad = "  " * self.scope.indent
            for t in trig:
                loop_lines.append(f"{pad}{flag} = std::fabs({t}) > {flag} ? std::fabs({t}) : {flag};")
        self.scope = saved
        self._declare_accs(decls, ind)
        if flag:
            nest.body.append(f"{'  ' * ind}float {flag} = 0.0f;")
        if pieces:
            for span, lines in pieces:
                self._simd_loop(nest, [], "", lines, span)
        else:
            self._simd_loop(nest, [(r, a) for r, a in zip(reds, accs) if a not in alias], flag, loop_lines)
        if flag:
            self._trig_redo(flag, decls, redo_lines, inner_dims, nest.chunked, ind, nest.body)
        results: dict[str, str] = {}
        if moments is not None:
            results = self._moments_check(moments, reds, accs, inner_dims, int(nest.rn), ind, nest.body)
        self._reduction_results(reds, accs, alias, results)

    def _split_pieces(self, fulls: list[ComputeNode], var: sympy.Symbol,
                      n: int) -> Optional[list[tuple[tuple[int, int], list[str]]]]:
        """A pointwise loop printed again as one loop per range between the points where a
        comparison of its variable with a constant changes answer (a cat's parts, a pad's
        edges): in each, the comparisons and the clamps of the parts' indices fold, so each
        part is loaded contiguously instead of every part gathered through a clamped index
        and selected (DenseNet's channels-last cats). None where there is no such point."""
        points = sorted(p for p in self.split_points if 0 < p < n)
        if not points or len(points) > self.MAX_LOOP_PIECES - 1:
            return None
        whole = {v: (0, int(size) - 1) for v, size in zip(self.g.gvars(), self.g.full) if size.is_Integer}
        indent = self.scope.indent
        out = []
        for lo, hi in zip([0, *points], [*points, n]):
            lines: list[str] = []
            self.scope = _Scope(lines, indent=indent)
            self.hoist_from, self.pieces = self.scope, {**whole, var: (lo, hi - 1)}
            try:
                self._compute_fulls(fulls)
            finally:
                self.pieces = None
            out.append(((lo, hi), lines))
        self.hoist_from = None
        return out

    # loops one pointwise loop may be split into (a cat of more parts is a library call)
    MAX_LOOP_PIECES = 16

    def _compute_fulls(self, fulls: list[ComputeNode]) -> None:
        """Full-level values of this pass, into scratch and to memory as needed."""
        for n in fulls:
            v = self.compute(n) if n.name not in self.scope.values else self.scope.values[n.name]
            if n.name in self.scratch:
                self.scope.lines.append(f"{'  ' * self.scope.indent}{self.scratch_ref(n.name)} = {v};")
            if n.name in self.g.stores:
                self.store(n, v, self.g.own_index(n))

    def _accumulations(self, reds: list[ComputeNode], accs: list[str], vals: list[CVal], alias: dict[str, str],
                       moments: Any, short_rows: bool, loop_lines: list[str]) -> list[tuple[ComputeNode, str, torch.dtype]]:
        """Each reduction's update in the loop body; returns the accumulators to declare."""
        if moments is not None:
            # the float sum of squares, in the loop scope (its square is the float's)
            sq = self.ops.mul(self.widened[moments[1].name], self.widened[moments[1].name])
        decls = []
        for r, a, v in zip(reds, accs, vals):
            if a in alias:
                continue
            acc_dtype = r.acc_dtype
            if moments is not None and a in (moments[0], moments[2]):
                v, acc_dtype = (self.widened[v.name] if a == moments[0] else sq), torch.float32
            elif a not in alias.values() and self._float_sum(r, v, short_rows):
                # accumulate the float itself: float->double conversion halves the
                # vector width (softmax 2k x 2k: -15% kernel time)
                v, acc_dtype = self.widened[v.name], torch.float32
            decls.append((r, a, acc_dtype))
            loop_lines.extend(self._accumulate(r, a, v, self.scope.indent))
        return decls

    def _simd_loop(self, nest: "_LoopNest", live: list[tuple[ComputeNode, str]], flag: str,
                   loop_lines: list[str], span: Optional[tuple[int, int]] = None) -> None:
        """The inner loop with its `omp simd` reduction clauses around `loop_lines` (over
        `span` of the inner dim, a piece of a split loop, else all of it)."""
        ind, inner_dims = nest.ind, nest.inner_dims
        simdlen = f" simdlen({self.opt.vector_width})" if self.opt.vector_width else ""
        clauses = "".join(f" reduction({_RED_OMP[r.reduction]}:{a})" for r, a in live)
        clauses += "".join(f" reduction(|:{a}_nan)" for r, a in live
                           if r.reduction in ("max", "min") and r.acc_dtype.is_floating_point)
        clauses += f" reduction(max:{flag})" if flag else ""
        nest.body.extend(self._loop_headers(inner_dims, nest.chunked, ind, f"#pragma omp simd{simdlen}{clauses}", span))
        brace = "  " * (ind + len(inner_dims) - 1 if inner_dims else ind)
        nest.body.append(f"{brace}{{")
        nest.body.extend(loop_lines)
        nest.body.append(f"{brace}}}")

    def _reduction_results(self, reds: list[ComputeNode], accs: list[str], alias: dict[str, str],
                           results: dict[str, str]) -> None:
        """Each reduction's value after the loop (NaN-propagating max/min), stored if it must be."""
        for r, a in zip(reds, accs):
            a = alias.get(a, a)
            res = results.get(a, a)
            if r.reduction in ("max", "min") and r.acc_dtype.is_floating_point:
                res = f"({a}_nan ? {cconst(float('nan'), r.acc_dtype)} : {a})"
            v = self.ops.round_to(self.emit(f"static_cast<{CTYPES[r.dtype]}>({res})", r.dtype), r.dtype)
            self.scope.values[r.name] = v
            if r.name in self.g.stores:
                self.store(r, v, self.g.outer_index(r.size))

    # Longest row a float32 sum accumulates in float (not double). The simd loop
    # keeps one partial sum per vector lane (16 with AVX-512), so a lane adds at
    # most 256 values: error ~ eps * sqrt(256) relative, like ATen's own float
    # Vectorized sums (softmax, layer_norm), far inside float32 test tolerances.
    FLOAT_SUM_MAX = 4096

    def _float_sum(self, r: ComputeNode, v: CVal, short_rows: bool) -> bool:
        """Whether reduction `r` may accumulate in float: a sum whose result is
        float32 anyway (sums kept in double for var/mean stay double), over short
        rows, of values that are float32 widened to double."""
        return (short_rows and r.reduction == "sum" and r.acc_dtype == torch.float64 and r.dtype == torch.float32
                and v.name in self.widened)

    def _loop_headers(self, inner_dims: Sequence[int], chunked: bool, ind: int, pragma: str,
                      span: Optional[tuple[int, int]] = None) -> list[str]:
        """The `for` lines of a row's inner loops (`pragma` above the innermost; "" for none;
        the innermost over `span` where given)."""
        g, gv = self.g, self.g.gvars()
        out = []
        for k, d in enumerate(inner_dims):
            pad = "  " * (ind + k)
            if k == len(inner_dims) - 1 and pragma:
                out.append(f"{pad}{pragma}")
            if span is not None and k == len(inner_dims) - 1:
                out.append(f"{pad}for (int64_t {gv[d]} = {span[0]}; {gv[d]} < {span[1]}; {gv[d]}++)")
            elif chunked:
                out.append(f"{pad}for (int64_t {gv[d]} = c0; {gv[d]} < std::min<int64_t>(c0 + {CHUNK}, "
                           f"{self.cx(g.full[d])}); {gv[d]}++)")
            else:
                out.append(f"{pad}for (int64_t {gv[d]} = 0; {gv[d]} < {self.cx(g.full[d])}; {gv[d]}++)")
        return out

    def _trig_redo(self, flag: str, decls: Sequence[tuple[ComputeNode, str, torch.dtype]], loop_lines: Sequence[str],
                   inner_dims: Sequence[int], chunked: bool, ind: int, body: list[str]) -> None:
        """The prelude's vectorizable sin/cos reduce by pi/2 exactly only below
        FL_TRIG_FAST_MAX (2^24); past it (up to 3.4e38) the result would be garbage.
        An exact reduction in every lane doubled sin^2+cos^2's kernel, and a branch in
        the loop stops g++ vectorizing it, so the loop only notes whether a large
        argument went by, and a block that had one runs again, scalar, with the exact
        functions: same stores (the kernel never writes over its inputs, see
        `_inplace_candidates`), accumulators restarted."""
        self.trig_redo = True
        pad = "  " * ind
        body.append(f"{pad}if ({flag} >= FL_TRIG_FAST_MAX)")
        body.append(f"{pad}{{")
        body.extend(self._acc_lines(decls, ind + 1, declare=False))
        body.extend("  " + ln for ln in self._loop_headers(inner_dims, chunked, ind, ""))
        close = "  " * (ind + len(inner_dims) - 1 if inner_dims else ind)
        body.append(f"  {close}{{")
        for ln in loop_lines:
            body.append("  " + re.sub(r"\bfl_(sin|cos)\(", r"fl_\1_exact(", ln))
        body.append(f"  {close}}}")
        body.append(f"{pad}}}")

    def _float_moments(self, reds: Sequence[ComputeNode], accs: Sequence[str], vals: Sequence[CVal],
                       alias: dict[str, str], short_rows: bool) -> Optional[tuple[str, CVal, str]]:
        """A row's sum and sum of squares of float32 values (var's one-pass form, kept
        in double) that may accumulate in float: the (sum accumulator, its double
        value, sum-of-squares accumulator), or None. Only over short rows, and only
        where no row statistic is an output of the kernel (layernorm in inference:
        the moments feed the normalisation alone, whose float32 result cannot show
        the difference; torch.var's result stays double-accurate, like eager's).
        Float accumulation halves the vector work of the moments pass (layernorm
        4k x 1k, the kernel alone: 0.72 -> 0.665 ms; the compiled call 3-5%);
        `_moments_check` redoes a row in double where float would lose digits."""
        g = self.g
        if not short_rows or any(g.level(n) != "full" for n in g.nodes if n.name in g.stores):
            return None
        live = [(r, a, v) for r, a, v in zip(reds, accs, vals) if a not in alias]
        for r, a, v in live:
            if r.reduction != "sum" or r.acc_dtype != torch.float64 or v.name not in self.widened:
                continue
            sq = self.scope.cache.get(f"({v} * {v})")
            for r2, a2, v2 in live:
                if r2.reduction == "sum" and r2.acc_dtype == torch.float64 and v2 is sq:
                    return a, v, a2
        return None

    def _moments_check(self, moments: tuple[str, CVal, str], reds: Sequence[ComputeNode], accs: Sequence[str],
                       inner_dims: Sequence[int], n: int, ind: int, body: list[str]) -> dict[str, str]:
        """After a float moments pass: the double sum and sum of squares the kernel
        reads on. Var = (Q - S^2/n)/n magnifies the float rounding of Q by
        Q / (Q - S^2/n) = (mean^2 + var) / var, at most 2 while mean^2 <= var. A row
        past that, or whose float Q overflowed, or whose squares fall below float's
        normal range (rms < 1e-15: subnormals carry fewer bits), or with a NaN, is
        summed again in double, as before. Returns accumulator -> the double
        variable holding its result."""
        a_s, _, a_q = moments
        pad = "  " * ind
        d_s, d_q = f"{a_s}_d", f"{a_q}_d"
        body.append(f"{pad}double {d_s} = {a_s}, {d_q} = {a_q};")
        body.append(f"{pad}if (!({d_s} * {d_s} <= {0.5 * n!r} * {d_q} && {d_q} < INFINITY && {d_q} >= {1e-30 * n!r}))")
        body.append(f"{pad}{{")
        r_s, r_q = f"{a_s}_r", f"{a_q}_r"
        body.append(f"{pad}  double {r_s} = 0, {r_q} = 0;")
        body.extend(self._loop_headers(inner_dims, False, ind + 1, f"#pragma omp simd reduction(+:{r_s}) reduction(+:{r_q})"))
        lpad = "  " * (ind + len(inner_dims))
        body.append(f"{lpad}{{")
        saved = self.scope
        self.scope = _Scope(body, indent=ind + 1 + len(inner_dims))
        r = reds[list(accs).index(a_s)]
        w = r.body(self.ops, self.g.full_index(r.full_size))
        w = w if w.dtype == torch.float64 else self.ops.to_dtype(w, torch.float64)
        body.append(f"{self.scope.indent * '  '}{r_s} += {w};")
        body.append(f"{self.scope.indent * '  '}{r_q} += {w} * {w};")
        self.scope = saved
        body.append(f"{lpad}}}")
        body.append(f"{pad}  {d_s} = {r_s};")
        body.append(f"{pad}  {d_q} = {r_q};")
        body.append(f"{pad}}}")
        return {a_s: d_s, a_q: d_q}

    @staticmethod
    def _shared_accumulators(reds: Sequence[ComputeNode], accs: Sequence[str], vals: Sequence[CVal]) -> dict[str, str]:
        """Reductions of one phase that need no accumulator of their own: the same
        reduction of the same value (layernorm's decomposition sums each row twice,
        once for the mean and once inside the variance), or a float32 sum whose
        float64 twin is already accumulated (rounding the double sum is at least
        as accurate). Maps such an accumulator to the one it reads instead; a
        row loop with one reduction fewer is ~10% faster for layernorm 4k x 1k.
        A shared accumulator stays in its own dtype: a sum one reader wants in
        float64 never becomes a float sum because another reader is float32."""
        seen: dict[tuple, str] = {}
        alias: dict[str, str] = {}
        for r, a, v in zip(reds, accs, vals):
            key = (r.reduction, v.name, r.acc_dtype)
            if key in seen:
                alias[a] = seen[key]
            else:
                seen[key] = a
        return alias

    def _outer_epilogue(self, nodes: Sequence[ComputeNode]) -> None:
        for n in nodes:
            v = self.compute(n)
            if n.name in self.g.stores:
                self.store(n, v, self.g.outer_index(n.size))

    def _acc_names(self, reds: Sequence[ComputeNode]) -> list[str]:
        names = []
        for _ in reds:
            self.counter += 1
            names.append(f"acc{self.counter}")
        return names

    def _declare_accs(self, decls: Sequence[tuple[ComputeNode, str, torch.dtype]], ind: int) -> None:
        """Declare the accumulators of one row pass, each in the dtype it accumulates in,
        before the loop (the current scope is the outer one)."""
        self.scope.lines.extend(self._acc_lines(decls, ind, declare=True))

    @staticmethod
    def _acc_lines(decls: Sequence[tuple[ComputeNode, str, torch.dtype]], ind: int, declare: bool) -> list[str]:
        """Each accumulator set to its initial value: declared (`T a = init;`) or, for a
        redone row pass, restarted (`a = init;`)."""
        out = []
        for r, a, acc_dtype in decls:
            t = CTYPES[acc_dtype] if r.reduction not in ("any", "all") else "int32_t"
            if r.reduction == "max":
                init = "-std::numeric_limits<%s>::infinity()" % t if acc_dtype.is_floating_point else f"std::numeric_limits<{t}>::lowest()"
            elif r.reduction == "min":
                init = "std::numeric_limits<%s>::infinity()" % t if acc_dtype.is_floating_point else f"std::numeric_limits<{t}>::max()"
            else:
                init = _RED_INIT[r.reduction]
            out.append(f"{'  ' * ind}{t + ' ' if declare else ''}{a} = {init};")
            if r.reduction in ("max", "min") and acc_dtype.is_floating_point:
                # an int flag, not bool: g++ has no vector type for bool reductions
                out.append(f"{'  ' * ind}{'int32_t ' if declare else ''}{a}_nan = 0;")
        return out

    def _accumulate(self, r: ComputeNode, a: str, v: CVal, indent: int) -> list[str]:
        pad = "  " * indent
        if r.reduction == "sum":
            return [f"{pad}{a} += {v};"] if r.acc_dtype != torch.bool else [f"{pad}{a} = {a} || {v};"]
        if r.reduction == "prod":
            return [f"{pad}{a} *= {v};"]
        if r.reduction == "any":
            return [f"{pad}{a} |= static_cast<int32_t>({v});"]
        if r.reduction == "all":
            return [f"{pad}{a} &= static_cast<int32_t>({v});"]
        cmp = ">" if r.reduction == "max" else "<"
        out = [f"{pad}{a} = {v} {cmp} {a} ? {v} : {a};"]
        if r.acc_dtype.is_floating_point:
            out.append(f"{pad}{a}_nan |= ({v} != {v});")
        return out

    def _finish(self, body: list[str]) -> KernelSource:
        name = self.g.name
        params = []
        for b in self.reads:
            if b in self.writes:
                continue
            params.append(f"const {storage_ctype(self.graph.buffers[b].dtype)}* __restrict__ b_{cname(b)}")
        for b in self.writes:
            params.append(f"{storage_ctype(self.graph.buffers[b].dtype)}* __restrict__ b_{cname(b)}")
        syms = sorted(self.symbols, key=lambda s: s.name)
        params += [f"const int64_t {s.name}" for s in syms]
        src = f'extern "C" void {name}({", ".join(params)})\n{{\n' + "\n".join(body) + "\n}\n"
        buffers = [b for b in self.reads if b not in self.writes] + list(self.writes)
        nbytes = sum(self.graph.nbytes(b) for b in buffers)
        return KernelSource(name=name, source=src, buffers=buffers, outputs=list(self.writes), symbols=syms,
                            bytes_accessed=nbytes, language="cpp", inplace=self._inplace_candidates())

    def _inplace_candidates(self) -> dict[str, list[str]]:
        """Inputs a pointwise kernel reads only at the very element it stores (same
        dtype and layout), and loads before that store in the loop body: writing the
        output over such an input is safe, because every element is loaded before
        it is overwritten and no iteration reads another's element. (A kernel with
        several outputs may store one before it loads an input another output
        needs: that input is no candidate for the first.) Reductions read rows
        several times: never in place."""
        if self.g.rflags is not None or self.trig_redo:
            return {}  # a redone block (large sin/cos arguments) reads its inputs again
        out: dict[str, list[str]] = {}
        for o in self.writes:
            offs = self.store_offsets.get(o, set())
            if len(offs) != 1:
                continue
            so = self.graph.buffers[o]
            cands = []
            for b in self.reads:
                if b in self.writes or self.load_offsets.get(b) != offs or (o, b) in self.load_after_store:
                    continue
                sb = self.graph.buffers[b]
                if sb.dtype == so.dtype and ir.same_layout(sb, so) and ir.same_expr(sb.offset, so.offset):
                    cands.append(b)
            if cands:
                out[o] = cands
        return out


def generate(group: KernelGroup, graph: GraphIR, options: Any) -> KernelSource:
    """The C++ source of one kernel (a function definition; the prelude is added by `library_source`)."""
    with CppKernel(group, graph, options) as kernel:
        return kernel.generate()


def canonical_source(ks: KernelSource) -> str:
    return canonical_text(ks.source, ks.name, r"\bb_\w+")


def alias_source(ks: KernelSource, same: KernelSource) -> str:
    """`ks` as a call of the identical kernel `same` (canonical_source equal)."""
    sig = ks.source.split("\n", 1)[0]
    params = sig[sig.index("(") + 1:sig.rindex(")")]
    args = [p.split()[-1] for p in params.split(",") if p.strip()]
    return f"{sig}\n{{\n  {same.name}({', '.join(args)});\n}}\n"


def library_source(kernels: Sequence[KernelSource]) -> str:
    from fuselens.compiler.codegen.cpp_prelude import PRELUDE

    return PRELUDE + "\n" + "\n".join(k.source for k in kernels)
