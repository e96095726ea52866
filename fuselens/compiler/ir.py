"""The loop-level IR.

A lowered graph (`GraphIR`) is a list of steps in FX order:

* `ComputeNode`: a buffer defined by a *pointwise* index function
  (`body(ops, index) -> value`) or a *reduction* (`body(ops, full_index) -> value`
  folded with `reduction` over `rdims` of `full_size`). Bodies are Python closures
  written against an abstract `ops` handler (the idea Inductor has): the C++ code
  generator passes a handler that prints C, the Triton one prints Triton, the
  dependency analysis passes one that records loads. Indices are sympy
  expressions over loop variables and the graph's size symbols, so dynamic shapes
  are plain symbols (`s77`) that become kernel arguments.
* `ExternNode`: a library call (mm, convolution, SDPA) or an ATen fallback for
  an op we do not lower; it runs the original FX node on real tensors.
* Views are not steps: they are index maps composed into the loaders of their
  consumers (`TensorValue.loader`); when a library call or a graph output needs
  one as a tensor, the runtime re-runs the ATen view op (free, no copy).

The `ops` contract (every handler implements these; values are opaque):
  load(buffer, index) constant(value, dtype) index_expr(expr, dtype)
  to_dtype(x, dtype) where(c, a, b), the unary ops in UNARY_OPS, the binary ops
  in BINARY_OPS, rand(seed, offset) and randn(seed, offset) (float32 Philox numbers
  of an int64 seed and an int32/int64 offset: random_ops.py). Operands of binary ops always have the same dtype (lowering
  inserts to_dtype); comparisons and logical ops return bool. The handlers that print
  source (codegen/cpp_ops.py, codegen/triton_ops.py) write most ops as rows of tables
  of forms; each handler's docstring says where an op is.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import sympy
import torch

Expr = sympy.Expr

UNARY_OPS = (
    "neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos tan asin acos atan "
    "sinh cosh tanh asinh acosh atanh erf erfc sigmoid floor ceil round trunc sign isnan isinf "
    "logical_not bitwise_not relu lgamma signbit frac square"
).split()
BINARY_OPS = (
    "add sub mul truediv floordiv truncdiv remainder fmod pow maximum minimum fmax fmin atan2 hypot "
    "copysign eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor "
    "lshift rshift nextafter"
).split()
REDUCTIONS = ("sum", "prod", "max", "min", "any", "all")


class FloorDiv(sympy.Function):
    """Integer floor division of non-negative index expressions (C `/`)."""

    is_integer = True
    nargs = 2

    @classmethod
    def eval(cls, base, div):
        if div == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and div.is_Integer:
            return sympy.Integer(int(base) // int(div))
        if isinstance(base, FloorDiv):  # (a // b) // c == a // (b * c)
            return FloorDiv(base.args[0], base.args[1] * div)
        return None


class ModularIndexing(sympy.Function):
    """(base // div) % mod for non-negative index expressions."""

    is_integer = True
    nargs = 3

    @classmethod
    def eval(cls, base, div, mod):
        if mod == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and div.is_Integer and mod.is_Integer:
            return sympy.Integer((int(base) // int(div)) % int(mod))
        return None


class Indirect(sympy.Symbol):
    """An index read from a tensor (an embedding's token id, a gather's index): a value
    of the generated code, named as its variable there, inside an index expression.
    Made by the ops handlers' `indirect(value, size)`, which clamp it to [0, size)."""


@functools.lru_cache(maxsize=None)  # sympy builds a Symbol per call; the scheduler asks thousands of times
def index_var(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


def sympify_size(s: Any) -> Expr:
    """An int, SymInt or sympy expression as a sympy expression."""
    if isinstance(s, torch.SymInt):
        return sympy.sympify(s.node.expr)
    if isinstance(s, sympy.Expr):
        return s
    return sympy.Integer(int(s))


def same_expr(a: Expr, b: Expr) -> bool:
    return a == b or _equal_expanded(a, b)


# The scheduler compares the same few sizes and offsets again for every candidate
# fusion (BERT training: 2830 expansions of 37 distinct pairs; 7789 offsets of 71)
@functools.lru_cache(maxsize=8192)
def _equal_expanded(a: Expr, b: Expr) -> bool:
    return sympy.expand(a - b) == 0


def same_sizes(a: Sequence[Expr], b: Sequence[Expr]) -> bool:
    return len(a) == len(b) and all(same_expr(x, y) for x, y in zip(a, b))


def squeeze(sizes: Sequence[Expr]) -> list[Expr]:
    """Sizes without the 1s: the iteration space a node really has."""
    return [s for s in sizes if s != 1]


def numel(sizes: Sequence[Expr]) -> Expr:
    if all(isinstance(s, (int, sympy.Integer)) for s in sizes):  # static shapes: no symbolic product
        return sympy.Integer(math.prod(int(s) for s in sizes))
    out: Expr = sympy.Integer(1)
    for s in sizes:
        out = out * s
    return out


def _concrete(e: Any, hints: dict) -> int:
    """`e` as an int, symbols replaced by their hints (TypeError or ValueError when it stays symbolic)."""
    if isinstance(e, (int, sympy.Integer)):
        return int(e)
    return int(sympy.sympify(e).subs(hints))


def reindex(space: Sequence[Expr], variables: Sequence[sympy.Symbol], size: Sequence[Expr]) -> Optional[list[Expr]]:
    """The index of each dim of `size` at `variables`, the loop over `space` (no 1s),
    when `size` walks the same elements in the same row-major order with dims merged
    or split: a 4x32x32 node in a 2x2x32x32 loop has d0 = 2*g0 + g1. None when its
    dims do not line up with the loop's (the products of leading dims never meet)."""
    dims = [s for s in size if s != 1]
    groups: list[tuple[list[int], list[int]]] = []  # (loop dims, node dims) of equal product
    i = j = 0
    while i < len(space) and j < len(dims):
        gi, nj, pg, pn = [i], [j], space[i], dims[j]
        while not same_expr(pg, pn):
            if not (sympy.sympify(pg).is_Integer and sympy.sympify(pn).is_Integer):
                return None
            if int(pg) < int(pn):
                i += 1
                if i == len(space):
                    return None
                gi.append(i)
                pg = pg * space[i]
            else:
                j += 1
                if j == len(dims):
                    return None
                nj.append(j)
                pn = pn * dims[j]
        groups.append((gi, nj))
        i, j = i + 1, j + 1
    if i != len(space) or j != len(dims):
        return None
    index: list[Expr] = []
    for gi, nj in groups:
        linear = sympy.Integer(0)
        for k in gi:
            linear = linear * space[k] + variables[k]
        inner = [numel([dims[t] for t in nj[q + 1:]]) for q in range(len(nj))]
        index += [linear if len(nj) == 1 else FloorDiv(linear, inner[0]) if q == 0
                  else ModularIndexing(linear, inner[q], dims[t]) for q, t in enumerate(nj)]
    it = iter(index)
    return [sympy.Integer(0) if s == 1 else next(it) for s in size]


def contiguous_strides(sizes: Sequence[Expr]) -> list[Expr]:
    strides: list[Expr] = []
    acc: Expr = sympy.Integer(1)
    for s in reversed(sizes):
        strides.append(acc)
        acc = acc * s
    return list(reversed(strides))


def dense_layout(size: Sequence[Expr], stride: Sequence[Expr], hints: dict) -> bool:
    """Strides that are a permutation of a contiguous layout (no gaps, no overlap)."""
    dims = [d for d in range(len(size)) if size[d] != 1]
    try:
        dims.sort(key=lambda d: _concrete(stride[d], hints))
    except (TypeError, ValueError):
        return False
    acc: Expr = sympy.Integer(1)
    for d in dims:
        if not same_expr(stride[d], acc):
            return False
        acc = acc * size[d]
    return True


def same_layout(a: "BufferSpec", b: "BufferSpec") -> bool:
    """Whether two buffers have the same sizes and strides."""
    return same_sizes(a.size, b.size) and same_sizes(a.stride, b.stride)


def same_memory(a: "BufferSpec", b: "BufferSpec", hints: dict) -> bool:
    """Whether two buffers span the same memory: the same layout, or both dense over as
    many elements (a [N, 384] matmul output and its [32, 56, 56, 384] view)."""
    if same_layout(a, b):
        return True
    return (same_expr(numel(a.size), numel(b.size)) and dense_layout(a.size, a.stride, hints)
            and dense_layout(b.size, b.stride, hints))


def step_edges(steps: Sequence[Any]) -> tuple[dict[str, int], list[set[int]], list[list[int]]]:
    """The data edges between a graph's steps: buffer -> the step producing it (a multi-output
    extern's `name_outN` too), each step's producers, each step's readers (step indices,
    readers in step order)."""
    producer = {s.name: i for i, s in enumerate(steps)}
    for i, s in enumerate(steps):
        for o in getattr(s, "outputs", None) or []:
            producer[o] = i
    deps = [{producer[r] for r in s.reads if r in producer} for s in steps]
    users: list[list[int]] = [[] for _ in steps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    return producer, deps, users


def buffer_readers(steps: Sequence[Any]) -> dict[str, list[int]]:
    """Each buffer -> the indices of the steps reading it, in step order."""
    out: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        for b in s.reads:
            out.setdefault(b, []).append(i)
    return out


def offset_of(index: Sequence[Expr], strides: Sequence[Expr], offset: Expr = sympy.Integer(0)) -> Expr:
    """The storage offset of a logical index (size-1 dims contribute nothing)."""
    return _offset_of(tuple(index), tuple(strides), offset)


@functools.lru_cache(maxsize=8192)
def _offset_of(index: tuple, strides: tuple, offset: Expr) -> Expr:
    out = offset
    for i, s in zip(index, strides):
        out = out + i * s
    return out


def format_sizes(sizes: Sequence[Expr]) -> str:
    return _format_sizes(tuple(sizes))


# each fusion decision's reason names its loop space: sympy prints the same few sizes
# thousands of times a graph (ResNet-50 training: 6190 calls, 0.3 s under cProfile)
@functools.lru_cache(maxsize=4096)
def _format_sizes(sizes: tuple) -> str:
    return "x".join(str(s) for s in sizes) if sizes else "scalar"


Loader = Callable[[Any, Sequence[Expr]], Any]


@dataclass(eq=False)
class TensorValue:
    """What lowering knows about one FX value: its sizes, dtype and how to read
    element `index` (a loader against the ops handler). `source` names the
    buffer the loader ultimately reads when it is a plain view of one."""

    size: list[Expr]
    dtype: torch.dtype
    loader: Loader
    source: Optional[str] = None
    direct: bool = False  # the loader reads `source` at its own strides (no view in between)
    strides: Optional[list[Expr]] = None  # `source`'s strides when direct


@dataclass(eq=False)
class BufferSpec:
    """A tensor that exists at run time: a graph input, an extern's output or a
    materialized compute node. Sizes/strides are symbolic."""

    name: str
    size: list[Expr]
    stride: list[Expr]
    dtype: torch.dtype
    offset: Expr = sympy.Integer(0)


@dataclass(eq=False)
class ComputeNode:
    """A pointwise buffer or a reduction. `size`/`stride` are its own layout (the
    strides eager would produce, from the FX node's fake tensor)."""

    name: str
    size: list[Expr]
    stride: list[Expr]
    dtype: torch.dtype
    body: Callable[[Any, Sequence[Expr]], Any]
    fx_nodes: list[str]
    aten_ops: list[str]
    reduction: Optional[str] = None  # one of REDUCTIONS
    full_size: list[Expr] = field(default_factory=list)  # reduction input sizes
    rdims: tuple[int, ...] = ()  # reduced dims of full_size
    acc_dtype: Optional[torch.dtype] = None  # accumulation dtype of a reduction
    reads: set[str] = field(default_factory=set)  # buffers/compute nodes it loads
    stack_trace: str = ""
    list_element: bool = False  # one element of a list op (`_foreach_*`): list_order.py
    # the lowered dim each loop dim iterates, once the scheduler reordered the loops
    # (permute_loops); None: as lowered. A reader that recomputes this node passes an
    # index in the lowered dims (inline_pointwise.py), which the body no longer takes.
    loop_order: Optional[list[int]] = None
    unrolled: str = ""  # a reduction over few elements computed pointwise: what it reduces ("sum over 2")

    @property
    def is_reduction(self) -> bool:
        return self.reduction is not None

    def outer_size(self) -> list[Expr]:
        """The kept dims of a reduction (its output without keepdim 1s)."""
        return [s for d, s in enumerate(self.full_size) if d not in self.rdims]

    def reduced_size(self) -> list[Expr]:
        return [s for d, s in enumerate(self.full_size) if d in self.rdims]

    def describe(self) -> str:
        if self.is_reduction:
            return f"{self.reduction} over {format_sizes(self.reduced_size())} of {format_sizes(self.full_size)}"
        if self.unrolled:
            return f"{self.unrolled}, unrolled: pointwise {format_sizes(self.size)}"
        return f"pointwise {format_sizes(self.size)}"


def memory_order(node: ComputeNode) -> Optional[list[int]]:
    """The dims of a pointwise node ordered by decreasing stride (size-1 dims stay
    where they are), or None when that is the order they have or the strides are
    not numbers."""
    dims = [d for d, s in enumerate(node.size) if s != 1]
    if not all(sympy.sympify(node.stride[d]).is_Integer for d in dims):
        return None
    ordered = sorted(dims, key=lambda d: -int(node.stride[d]))  # stable: ties keep their order
    if ordered == dims:
        return None
    it = iter(ordered)
    return [next(it) if s != 1 else d for d, s in enumerate(node.size)]


def permute_loops(node: ComputeNode, order: Sequence[int]) -> None:
    """Make `node` iterate its dims in `order` (new dim i is old dim order[i]). Its
    buffer is the same memory: each element keeps its offset, only the loop over them
    changes, so readers that load it by offset are not affected; readers that recompute
    it at an index in its lowered dims go through `loop_order`."""
    assert not node.is_reduction
    body, order = node.body, list(order)

    def permuted(ops: Any, index: Sequence[Expr]) -> Any:
        old = [sympy.Integer(0)] * len(order)
        for i, d in enumerate(order):
            old[d] = index[i]
        return body(ops, old)

    lowered = node.loop_order if node.loop_order is not None else list(range(len(order)))
    node.loop_order = [lowered[d] for d in order]
    node.size = [node.size[d] for d in order]
    node.stride = [node.stride[d] for d in order]
    node.body = permuted


@dataclass(eq=False)
class ExternNode:
    """A library call or ATen fallback: runs `fx_node` with real tensors."""

    name: str
    fx_node: Any  # torch.fx.Node
    kind: str  # "extern" (mm, conv, sdpa: on purpose) or "fallback" (not lowered)
    reason: str = ""
    reads: set[str] = field(default_factory=set)
    stack_trace: str = ""
    outputs: list[str] = field(default_factory=list)  # run-time buffers it produces


@dataclass(eq=False)
class GraphIR:
    """The lowered graph: steps in a valid execution order plus the tables the
    scheduler, code generators and runtime need."""

    steps: list[Any] = field(default_factory=list)  # ComputeNode | ExternNode, FX order (list_order.py: element order)
    inputs: list[BufferSpec] = field(default_factory=list)
    buffers: dict[str, BufferSpec] = field(default_factory=dict)  # every run-time tensor by name
    values: dict[str, Any] = field(default_factory=dict)  # fx name -> TensorValue / scalar expr / tuple
    symbols: dict[sympy.Symbol, tuple] = field(default_factory=dict)  # symbol -> ("arg", i) | ("size", i, d) | ("stride", i, d)
    size_hints: dict[sympy.Symbol, int] = field(default_factory=dict)
    lowered: dict[str, bool] = field(default_factory=dict)  # fx node -> lowered (True) / ATen (False)
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    runtime_views: set[str] = field(default_factory=set)  # view nodes re-run by the runtime
    constants: dict[str, Any] = field(default_factory=dict)  # get_attr tensors by name
    # compute node -> the graph input it overwrites (an input mutation kept in the graph)
    input_mutations: dict[str, str] = field(default_factory=dict)
    chains: dict[str, int] = field(default_factory=dict)  # list_order.py: a chain's first step -> its steps
    # what the scheduler traced of each compute node's body, kept across the graph's
    # schedules and for code generation (analysis_of says when an entry is stale)
    node_analysis: dict[str, list] = field(default_factory=dict, repr=False, compare=False)

    def compute_nodes(self) -> list[ComputeNode]:
        return [s for s in self.steps if isinstance(s, ComputeNode)]

    def nbytes(self, name: str) -> int:
        """Bytes of buffer `name` at the example inputs' sizes (0 for a name with no buffer)."""
        spec = self.buffers.get(name)
        return self.hint(numel(spec.size)) * spec.dtype.itemsize if spec is not None else 0

    def hint(self, expr: Expr) -> int:
        """A concrete value for a size expression, from the example inputs."""
        try:
            return _concrete(expr, self.size_hints)
        except (TypeError, ValueError):
            return 1


def returns_alias(fx_node: Any) -> bool:
    """Whether an FX node's op (or a plan step's target) returns a view of an input (its schema says so)."""
    schema = getattr(getattr(fx_node, "target", None), "_schema", None)
    rets = schema.returns if schema is not None else ()
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


def released_inputs(graph: "GraphIR") -> set[str]:
    """Graph inputs whose memory the graph's last use releases: a backward's saved
    activations (AOTAutograd clears its saved tensors before the call). Never
    parameters (`primals_*`, which the module holds), nor incoming gradients
    (`tangents_*`: autograd's engine holds the gradients it passes a node until the
    node returns; GPT-2's logits gradient, 393 MB, was alive at the backward's peak
    after the plan had counted it freed), nor a forward's or an inference graph's
    inputs (the caller holds them). The scheduler's peak estimates and the run-time
    plan's memory order both count memory this way."""
    names = [i.name for i in graph.inputs]
    if not any(n.startswith("tangents_") for n in names):
        return set()
    return {n for n in names if not n.startswith(("primals_", "tangents_"))}


class IndexedLoads:
    """An ops handler that also takes loads of compute nodes at their logical index
    (`load_at(name, index, strides)`): inline_pointwise.py evaluates an inlined
    producer's body there, with no division of a flat offset back into an index."""

    def load_at(self, name: str, index: Sequence[Expr], strides: Sequence[Expr]) -> Any:
        raise NotImplementedError


class LoadRecorder:
    """An ops handler that only records which buffers a body loads (and the
    index it loads them at); every other op returns a dummy value."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, Expr]] = []

    def load(self, name: str, index: Expr) -> str:
        self.loads.append((name, index))
        return "v"

    def indirect(self, value: Any, size: Expr) -> Expr:
        return Indirect("indirect", integer=True)

    def __getattr__(self, name: str) -> Callable[..., str]:
        return lambda *args, **kwargs: "v"


def masked_where(ops: Any, cond: Any, then: Callable[[], Any], otherwise: Callable[[], Any]) -> Any:
    """where(cond, then(), otherwise()), each branch read only where it is taken on a
    handler that can mask its loads (`masked_where` on its class: Triton). A
    select's or a cat's backward puts one gradient in each part of its output; read
    unmasked, every part loads every gradient (ViT's q, k, v: 3x the traffic)."""
    own = getattr(type(ops), "masked_where", None)  # the class's: __getattr__ handlers answer any name
    if own is not None:
        return own(ops, cond, then, otherwise)
    return ops.where(cond, then(), otherwise())


def masks_branch_loads(ops: Any, cond: Any) -> bool:
    """Whether `ops` (or the handler it wraps, as `_ops`) reads the branches of
    `masked_where(cond, ...)` only where each is taken: its class's
    `masks_branch_loads(cond)` (Triton: for a condition computed from indices). Read
    from the class, as `masked_where` is: a handler's `__getattr__` answers any name."""
    while isinstance(getattr(ops, "__dict__", None), dict) and "_ops" in vars(ops):
        ops = ops._ops
    own = getattr(type(ops), "masks_branch_loads", None)
    return bool(own(ops, cond)) if callable(own) else False


def analysis_of(graph: "GraphIR", node: ComputeNode) -> list:
    """[body, reads, loads or None, per-loop-space values] traced from `node`'s body
    (`graph.node_analysis`), valid while its body and reads are the ones it was traced
    from: the scheduler asks for every candidate fusion, and again when a graph is
    scheduled twice; the code generator asks once more."""
    entry = graph.node_analysis.get(node.name)
    if entry is None or entry[0] is not node.body or entry[1] != node.reads:
        entry = graph.node_analysis[node.name] = [node.body, frozenset(node.reads), None, {}]
    return entry


def traced_loads(graph: "GraphIR", node: ComputeNode) -> list[tuple[str, Expr]]:
    """`record_loads(node)`, traced once while its body stays (analysis_of)."""
    entry = analysis_of(graph, node)
    if entry[2] is None:
        entry[2] = record_loads(node)
    return entry[2]


def record_loads(node: ComputeNode) -> list[tuple[str, Expr]]:
    """The (buffer, index) loads of a node's body at its symbolic iteration index."""
    rec = LoadRecorder()
    sizes = node.full_size if node.is_reduction else node.size
    node.body(rec, [index_var("d", i) for i in range(len(sizes))])
    return rec.loads


def _max_value(e: Expr, ranges: dict) -> Optional[Expr]:
    """An upper bound of a sum of non-negative terms coef*var (var < ranges[var]),
    or None when the expression is not of that form."""
    total: Expr = sympy.Integer(0)
    for t in sympy.Add.make_args(e):
        coef, rest = t.as_coeff_Mul()
        if coef < 0:
            return None
        vars_ = [v for v in t.free_symbols if v in ranges]
        bound = _clamp_bound(rest) if coef > 0 else None
        if bound is not None:  # a clamped index (cat, padding): at most its upper clamp
            total += coef * bound
            continue
        if not vars_:
            if t.is_number or all(s.is_positive for s in t.free_symbols):
                total += t
                continue
            return None
        if len(vars_) != 1 or t.has(FloorDiv, ModularIndexing, sympy.Min, sympy.Max):
            return None
        v = vars_[0]
        c = sympy.cancel(t / v)
        if c.free_symbols & set(ranges) or not (c.is_positive or c.is_number and c > 0):
            return None
        total += c * (ranges[v] - 1)
    return total


def _clamp_bound(e: Expr) -> Optional[Expr]:
    """The upper bound of `Min(..., c)` over non-negative arguments (lowering clamps
    indices as Min(Max(i, 0), n - 1)), else None."""
    if not isinstance(e, sympy.Min):
        return None
    nums = [a for a in e.args if a.is_number]
    nonneg = all((a.is_number and a >= 0) or (isinstance(a, sympy.Max) and any(b.is_number and b >= 0 for b in a.args))
                 for a in e.args)
    return min(nums) if nums and nonneg else None


def _less(a: Expr, b: Expr) -> bool:
    d = sympy.expand(b - a)
    return bool(d.is_positive) or (d.is_number and d > 0)


def substitute(e: Any, sub: dict) -> Expr:
    """`sympify(e).xreplace(sub)`, with each Min and Max of the result built once per
    process: sympy evaluates them through its assumptions system (a clamped index's
    `Max(d0 - 21, 0)`: ~2 ms), and the scheduler and code generators place the same
    clamps in loop after loop (ResNet-50 training: 240 built, 14 distinct)."""
    return _substitute_once(sympy.sympify(e), tuple(sub.items()))


# the scheduler substitutes each member's loads into every candidate kernel's loop
# variables: members of a layer read alike (ResNet-50 training: 6208 substitutions)
@functools.lru_cache(maxsize=16384)
def _substitute_once(e: Expr, sub_items: tuple) -> Expr:
    return _substitute(e, dict(sub_items))


def _substitute(e: Expr, sub: dict) -> Expr:
    got = sub.get(e)
    if got is not None:
        return got
    if not e.args:
        return e
    args = tuple(_substitute(a, sub) for a in e.args)
    if args == e.args:
        return e
    if isinstance(e, (sympy.Min, sympy.Max)):
        return _min_max(e.func, args)
    return e.func(*args)


@functools.lru_cache(maxsize=4096)
def _min_max(func: Any, args: tuple) -> Expr:
    """`func(*args)` (Min or Max) less each argument another one bounds by a sum of
    non-negative terms, as sympy's evaluation would drop it, without its assumptions
    system: that compares symbolic arguments at 10 ms a clamp of a channels-last index
    (2 s of DenseNet-121's compile), where the index variables' being non-negative is
    all it could use."""
    if all(a.is_number for a in args):
        return func(*args)
    keep = [a for i, a in enumerate(args)
            if not any(j != i and b != a and nonnegative(sympy.expand(a - b if func is sympy.Min else b - a))
                       for j, b in enumerate(args))]
    keep = list(dict.fromkeys(keep))  # equal arguments: one
    return keep[0] if len(keep) == 1 else func(*keep, evaluate=False)


def nonnegative(e: Expr) -> bool:
    """Whether `e` is a sum of products of non-negative numbers and symbols (index
    variables and sizes are declared non-negative), without asking the assumptions system."""
    if e.is_Number:
        return bool(e >= 0)
    if e.is_Symbol:
        return bool(e.is_nonnegative)
    if isinstance(e, (sympy.Add, sympy.Mul)):
        return all(nonnegative(a) for a in e.args)
    return isinstance(e, (FloorDiv, ModularIndexing)) and all(nonnegative(a) for a in e.args)


def simplify_index(e: Expr, ranges: dict) -> Expr:
    """Remove FloorDiv/ModularIndexing that the ranges of the loop variables make
    trivial (reshape index maps read back at the iteration index)."""
    return _simplify_index(e, tuple(ranges.items()))


@functools.lru_cache(maxsize=8192)  # the scheduler asks again for every candidate fusion
def _simplify_index(e: Expr, range_items: tuple) -> Expr:
    ranges = dict(range_items)

    def fd(base: Expr, div: Expr) -> Expr:
        base = sympy.expand(base)
        q, rest = [], []
        for t in sympy.Add.make_args(base):
            (q if sympy.fraction(sympy.cancel(t / div))[1] == 1 else rest).append(t)
        r = sympy.Add(*rest)
        mx = _max_value(r, ranges)
        if mx is not None and _less(mx, div):
            return sympy.expand(sympy.Add(*q) / div)
        return FloorDiv(base, div)

    def rec(x: Expr) -> Expr:
        if not x.args:
            return x
        args = [rec(a) for a in x.args]
        if isinstance(x, FloorDiv):
            return fd(args[0], args[1])
        if isinstance(x, ModularIndexing):
            base, div, mod = args
            hi = fd(base, div * mod)
            lo = fd(base, div)
            if hi == 0:
                return lo
            diff = sympy.expand(lo - mod * hi)
            if not diff.has(FloorDiv):
                return diff
            return ModularIndexing(base, div, mod)
        if isinstance(x, (sympy.Min, sympy.Max)):
            return _min_max(x.func, tuple(args))
        return x.func(*args)

    return _recombine(sympy.expand(rec(e)))


def _recombine(e: Expr) -> Expr:
    """c*M*FloorDiv(b, d*M) + c*ModularIndexing(b, d, M) == c*FloorDiv(b, d): the two
    halves of a split dim, read back together (a contiguous buffer through a split view)."""
    while True:
        terms = sympy.Add.make_args(e)
        for t in terms:
            c, m = t.as_coeff_Mul()
            if not isinstance(m, ModularIndexing):
                continue
            b, d, mod = m.args
            want = c * mod * FloorDiv(b, d * mod)
            if want in terms:
                e = sympy.expand(e - t - want + c * FloorDiv(b, d))
                break
        else:
            return e


def op_name(target: Any) -> str:
    """An FX call target as events and messages print it: `aten.add.Tensor` for ops
    (ours too, `fuselens.conv2d_bias_relu.default`), a function's `__name__` otherwise."""
    try:
        return _op_names[target]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    s = str(target)
    name = s if s.startswith(("aten.", "prims.")) or isinstance(target, torch._ops.OpOverload) \
        else getattr(target, "__name__", s)
    try:
        _op_names[target] = name
    except TypeError:
        pass
    return name


# printing an OpOverload takes ~14 us, and lowering names every FX node it lowers
# (ResNet-50 training: 10779 names, 0.15 s)
_op_names: dict[Any, str] = {}
