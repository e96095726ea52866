"""Cheap pointwise nodes recomputed inside their readers instead of stored.

The scheduler fuses a producer into a consumer only when both iterate over the
same space. Real models are full of cheap producers read in another space:
Llama's rotary embedding negates half of q (`neg`, 2x4x128x32) that a `cat`
reads inside 2x4x128x64, scales `cos` once (128x64) for four broadcasting
multiplies, and builds 0-d `scalar_tensor`s that a `where` reads everywhere.
Each was a kernel of its own, a launch and a buffer round trip (Llama inference
on the H100: 145 launches against Inductor's 110). Inductor has no such kernels
because its pointwise IR nodes are inlined into their readers unless realized;
this pass gives ours the same property, after lowering.

A pointwise node is removed from the graph, and every reader evaluates its body
where it loaded it, when
- a compute node in another iteration space reads it (in the same space the
  scheduler fuses, and says why when it does not);
- all its readers are compute nodes and it is not a graph output;
- it does not derive from a reduction (a row statistic's epilogue such as
  rsqrt(var + eps) stays once per row in the row's kernel), unless it only moves
  values to one reader, at most once each: Swin's cyclic shift rolls a layer norm's
  output twice before a copy partitions it into windows, and the copy now loads the
  normalized values where the rolls took them from (three kernels fewer a block), or
  it is trivial (at most TRIVIAL_OPS operations) on buffers that exist anyway, the
  graph's inputs and outputs (BatchNorm's backward scales its bias gradient by 1/N for
  the input gradient: a per-channel buffer a layer);
- it is cheap: each reader element recomputes at most MAX_OPS operations (the
  producer's, times how often the reader loads it); on a target where a
  transcendental function costs more than a load (C++), a producer calling one
  is not evaluated more often in its readers than it has elements;
- it is not a cat read by another cat (DenseNet's cats, each extending the last:
  inlined link by link, each cheap alone, the last layer's kernel would recompute
  every cat before it);
- memory traffic does not grow: with several readers it reads at most one
  buffer not much smaller than itself (each reader then loads that buffer where it loaded the producer;
  otherwise a residual stream x + attention + MLP ... would be recomputed layer
  after layer), unless its readers iterate over as many elements each (one kernel).
A producer that must stay stored (a graph output, or read by a library call) is
still recomputed by its readers in other spaces when it is trivial (at most
TRIVIAL_OPS operations: a negation, a constant).

After scheduling, `recompute_narrow_stores` takes the same step for a producer
that a kernel would store only for readers in other kernels, when recomputing
it reads no more bytes than loading it (and it is then not written): BatchNorm's
backward kept `x - mean` and a float32 copy of a bfloat16 gradient, 4 bytes an
element written and read again, where its readers could load the 2-byte operands
(ResNet-50 training); ViT's last LayerNorm stored the float32 product of its
output gradient and the saved normalized input for the weight gradient's column
sum, which loads the saved input instead, and the buffer is gone from the
backward's peak. Readers that evaluate it on part of its elements (a select of one
token) recompute it when reading its inputs for those costs less than writing it
whole: ViT's last residual sum was stored for the class token alone. The scheduler
then runs again on the changed readers.

Readers reach an inlined producer through its loader, which hands over the
logical index (`ir.IndexedLoads`); a load by flat offset is mapped back to the
index that offset has in the producer's dense layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import sympy

from fuselens.compiler import ir
from fuselens.compiler.ir import ComputeNode, Expr, ExternNode, GraphIR

MAX_OPS = 12
TRIVIAL_OPS = 2
MATH = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh", "sinh", "cosh",
        "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf", "erfc", "pow", "sigmoid", "atan2", "rand", "randn"}
# ops that are many operations each: a Philox draw is ten rounds of two 32-bit multiplies
OP_COST = {"rand": 24, "randn": 40, "constant": 0}
SMALL_READ = 16  # a read of a buffer this many times smaller than the producer is not counted as traffic


@dataclass
class Inlined:
    """One producer recomputed in its readers: what the fusion events say."""

    node: str
    aten_op: str
    readers: list[str]
    ops: int
    kept: bool  # still stored for a graph output or a library call
    why: str = "cheaper than a kernel and a buffer of its own"

    def reason(self) -> str:
        ops = f"{self.ops} op{'s' if self.ops != 1 else ''}"
        text = (f"{self.node} ({self.aten_op}, {ops}) is recomputed inside {', '.join(self.readers)} instead of "
                f"stored and loaded: {self.why}")
        return text + ("; it is still stored for a graph output or a library call" if self.kept else "")


class _CountingOps:
    """An ops handler counting operations (loads included) of one body, and its
    transcendental functions."""

    def __init__(self) -> None:
        self.count = 0
        self.math = 0
        self.gathers = 0  # indices read from a tensor

    def indirect(self, value: Any, size: Expr) -> Expr:
        self.count += 1
        self.gathers += 1
        return ir.Indirect("indirect", integer=True)

    def __getattr__(self, name: str) -> Any:
        def op(*args: Any, **kwargs: Any) -> str:
            self.count += OP_COST.get(name, 1)  # a constant is free: a literal in the kernel
            self.math += name in MATH
            return "v"

        return op


class _Value:
    """A value in `_moves_data`'s evaluation: the op that made it."""

    __slots__ = ("op",)

    def __init__(self, op: str) -> None:
        self.op = op


class _ValueOps:
    """An ops handler whose values say which op made them; an index computed from
    loaded values (a gather's) becomes a symbol, as in a kernel."""

    def load(self, name: str, index: Expr) -> _Value:
        return _Value("load")

    def load_at(self, name: str, index: Sequence[Expr], strides: Sequence[Expr]) -> _Value:
        return _Value("load")

    def indirect(self, value: Any, size: Expr) -> Expr:
        return ir.Indirect("indirect", integer=True)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: _Value(name)


def _moves_data(node: ComputeNode) -> bool:
    """Whether `node` only moves values (a roll, a gather, a permuted copy): its value
    is a load, at whatever index it computes."""
    out = node.body(_ValueOps(), [ir.index_var("d", i) for i in range(len(node.size))])
    return isinstance(out, _Value) and out.op == "load"


def _counted(node: ComputeNode) -> _CountingOps:
    counter = _CountingOps()
    node.body(counter, [ir.index_var("d", i) for i in range(len(node.size))])
    return counter


def _amplified(graph: GraphIR, p: ComputeNode, readers: Sequence[ComputeNode]) -> bool:
    """Whether the readers together evaluate `p` more times than it has elements."""
    return _evaluations(graph, p, readers) > graph.hint(ir.numel(p.size))


def _evaluations(graph: GraphIR, p: ComputeNode, readers: Sequence[ComputeNode]) -> int:
    """How many times the readers together evaluate `p`."""
    return sum(graph.hint(ir.numel(_space(u))) * _loads_of(graph, p, u) for u in readers)


def _evaluated_on_part(graph: GraphIR, p: ComputeNode, readers: Sequence[ComputeNode]) -> bool:
    """Whether the readers together evaluate `p` on fewer elements than it has: stored,
    it is written where nobody reads it (ViT's last LayerNorm, 197 tokens an image,
    of which the head reads the class token's: an 18 MB float32 buffer alive at the
    training step's peak, the forward's end)."""
    return _evaluations(graph, p, readers) < graph.hint(ir.numel(p.size))


class _InliningOps(ir.IndexedLoads):
    """Forwards every op to `ops`, except loads of inlined producers, which
    evaluate the producer's body (through this handler: producers nest)."""

    def __init__(self, ops: Any, producers: dict[str, ComputeNode]) -> None:
        self._ops = ops
        self._producers = producers

    def load(self, name: str, index: Expr) -> Any:
        p = self._producers.get(name)
        if p is None:
            return self._ops.load(name, index)
        return self._evaluate(p, logical_index(p, index))

    def load_at(self, name: str, index: Sequence[Expr], strides: Sequence[Expr]) -> Any:
        p = self._producers.get(name)
        if p is None:
            return self._ops.load(name, ir.offset_of(index, strides))
        if p.loop_order is not None:  # the scheduler reordered its loops after this reader was lowered
            return self._evaluate(p, [index[d] for d in p.loop_order])
        return self._evaluate(p, list(index))

    def masked_where(self, cond: Any, then: Callable[[], Any], otherwise: Callable[[], Any]) -> Any:
        return ir.masked_where(self._ops, cond, then, otherwise)  # the branches load through this handler

    def _evaluate(self, p: ComputeNode, index: list[Expr]) -> Any:
        v = p.body(self, index)
        if getattr(v, "dtype", p.dtype) != p.dtype:
            v = self._ops.to_dtype(v, p.dtype)
        round_to = getattr(self._ops, "round_to", None)
        return round_to(v, p.dtype) if round_to is not None else v  # a 16-bit result rounds as a stored one

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)


def logical_index(node: ComputeNode, offset: Expr) -> list[Expr]:
    """The index whose element sits at `offset` in `node`'s dense layout (for loads
    that reach a producer as a flat offset; its own loaders pass the index itself)."""
    return [sympy.Integer(0) if size == 1 else ir.ModularIndexing(offset, stride, size)
            for size, stride in zip(node.size, node.stride)]


def _space(node: ComputeNode) -> Sequence[Expr]:
    return node.full_size if node.is_reduction else node.size


def _with_inlined(body: Any, producers: dict[str, ComputeNode]) -> Any:
    """`body` evaluating `producers` (its own; it may grow) where it loaded them."""

    def inlined(ops: Any, index: Sequence[Expr]) -> Any:
        if isinstance(ops, _InliningOps):  # inside a reader's evaluation of this node: both sets apply
            ops = _InliningOps(ops._ops, {**ops._producers, **producers})
        else:
            ops = _InliningOps(ops, producers)
        return body(ops, index)

    inlined.producers = producers  # type: ignore[attr-defined]
    return inlined


def _mutates(step: ExternNode) -> bool:
    schema = getattr(getattr(step.fx_node, "target", None), "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def inline_pointwise(graph: GraphIR, output_sources: set[str], *, costly_math: bool = False,
                     declined: Optional[dict[str, str]] = None) -> list[Inlined]:
    """Recompute cheap pointwise producers in their readers (see the module docstring).
    `costly_math`: a transcendental function costs more than a load (the C++ target).
    Mutates `graph`; returns what it inlined, in graph order. `declined`, when given,
    gets why each producer read in another iteration space stays a kernel of its own
    (the scheduler's refusal to fuse them says only that their spaces differ)."""
    why_not = declined if declined is not None else {}
    if any(isinstance(s, ExternNode) and _mutates(s) for s in graph.steps):
        return []  # an in-place library call could change what a moved computation reads
    drop_unread(graph, output_sources)
    readers = _readers(graph)
    done: list[Inlined] = []
    after_reduction = _after_reduction(graph)
    stored = set(output_sources) | {i.name for i in graph.inputs} | set(graph.constants)
    for p in reversed(list(graph.steps)):  # readers first: a chain of producers collapses into its last reader
        if not isinstance(p, ComputeNode) or p.is_reduction or not readers.get(p.name):
            continue
        users = readers[p.name]
        compute_users = [u for u in users if isinstance(u, ComputeNode)]
        kept = p.name in output_sources or len(compute_users) < len(users)
        if not compute_users or not ir.dense_layout(p.size, p.stride, graph.size_hints):
            continue
        if all(_in_space_of(p, u) for u in compute_users):
            continue  # the scheduler fuses readers in the same space (and says why when it does not)
        why, ops = _why_not_inlined(graph, p, compute_users, kept, after_reduction[p.name], costly_math, stored)
        if why:
            why_not[p.name] = why
            continue
        if kept:  # stored anyway: only readers in another iteration space gain (no kernel to wait for)
            compute_users = [u for u in compute_users if not _in_space_of(p, u)]
        for u in compute_users:
            _inline_into(u, p, readers)
        if not kept:
            graph.steps.remove(p)
            graph.buffers.pop(p.name, None)
            for b in p.reads:
                readers[b] = [r for r in readers[b] if r is not p]
        done.append(Inlined(p.name, p.aten_ops[0] if p.aten_ops else p.name, [u.name for u in compute_users], ops,
                            kept))
    done.reverse()
    return done


def _cat_read_by_cat(p: ComputeNode, readers: Sequence[ComputeNode]) -> bool:
    """Whether `p` is a cat that one of `readers`, a cat too, extends (DenseNet's cats after
    cat-extends-cat: recomputed link by link, each link cheap alone, the last layer's kernel
    selected among every cat before it: 27 ms a kernel on the CPU)."""
    def is_cat(n: ComputeNode) -> bool:
        return bool(n.aten_ops) and n.aten_ops[0] == "aten.cat.default"

    return is_cat(p) and any(is_cat(u) for u in readers)


def _why_not_inlined(graph: GraphIR, p: ComputeNode, compute_users: list[ComputeNode], kept: bool,
                     after_reduction: bool, costly_math: bool, stored: set[str]) -> tuple[str, int]:
    """(why `p` stays stored instead of recomputed in `compute_users`, some in another
    iteration space, in a user's words, "" when it is recomputed there; its operations).
    `stored`: the buffers that exist whatever is inlined (the graph's inputs and outputs)."""
    counted = _counted(p)
    ops = counted.count
    if after_reduction and not (len(compute_users) == 1 and _moves_data(p) and not _amplified(graph, p, compute_users)
                                or _evaluated_on_part(graph, p, compute_users)
                                or _trivial_of_stored(p, ops, kept, stored)):
        # a row statistic's epilogue (rsqrt(var + eps)): the row's kernel computes it once per row
        return "it is computed from a reduction's result, once per row in the row's kernel", 0
    if _cat_read_by_cat(p, compute_users):
        return "it is a cat that another cat extends: recomputed there, each cat would select among every cat " \
               "before it", ops
    if costly_math and counted.math and _amplified(graph, p, compute_users):
        # Llama's rotary cos/sin, once per position, would be evaluated per head and layer
        return "its readers would evaluate its transcendental functions more often than it has elements", ops
    if kept:
        if ops > TRIVIAL_OPS:
            return (f"it is stored anyway (a graph output or a library call reads it), and at {ops} ops more "
                    f"than a copy", ops)
        return "", ops
    # a producer that only moves values (a gather into routing order) ends in the load that
    # replaces its reader's load of it: that load is not recomputation
    extra = ops - 1 if _moves_data(p) else ops
    loads = max(_loads_of(graph, p, u) for u in compute_users)
    worst = extra * loads
    if worst > MAX_OPS:
        besides = f" ({extra} besides the load it replaces)" if extra != ops else ""
        return (f"its {ops} ops{besides}, loaded {loads} times by a reader, would be {worst} operations an element "
                f"there (at most {MAX_OPS})", ops)
    if len(compute_users) > 1 and len(_large_reads(graph, p)) > 1 and not _one_space(graph, p, compute_users):
        return "each of its readers would load all of its inputs instead of one buffer", ops  # more memory traffic
    return "", ops


def _trivial_of_stored(p: ComputeNode, ops: int, kept: bool, stored: set[str]) -> bool:
    """Whether `p`, an epilogue of a reduction, is a trivial one of buffers that exist
    anyway: its readers then load what they would, and recompute an operation or two.
    BatchNorm's backward scales the summed gradient by 1/N for its input gradient; the sum
    is the bias gradient, an output. Stored, the scaled copy was one more per-channel
    buffer and store a layer (DenseNet-121: 120 a step, on a host-bound step)."""
    return not kept and ops <= TRIVIAL_OPS and bool(p.reads) and p.reads <= stored


def _readers(graph: GraphIR) -> dict[str, list[Any]]:
    """For each buffer, the steps that read it, in graph order."""
    out: dict[str, list[Any]] = {}
    for s in graph.steps:
        for b in s.reads:
            out.setdefault(b, []).append(s)
    return out


def _after_reduction(graph: GraphIR) -> dict[str, bool]:
    """For each compute node: whether it is computed from a reduction's result through
    pointwise nodes (a row statistic's epilogue, kept once per row in the row's kernel).
    A gather ends the chain: what it picks by an index tensor is no row's epilogue, no
    row kernel computes it (Mixtral's routing weights, normalized by their sum, gathered
    into the experts' order and multiplied into the experts' rows)."""
    out: dict[str, bool] = {}
    for s in graph.steps:
        if isinstance(s, ComputeNode):
            out[s.name] = s.is_reduction or (any(out.get(b, False) for b in s.reads) and not _counted(s).gathers)
    return out


def _inline_into(u: ComputeNode, p: ComputeNode, readers: dict[str, list[Any]]) -> None:
    """Make reader `u` evaluate `p` where it loaded it, reading what `p` read."""
    own = getattr(u.body, "producers", None)
    if own is None:
        own = {}
        u.body = _with_inlined(u.body, own)
    own[p.name] = p
    u.reads = (u.reads - {p.name}) | p.reads
    u.fx_nodes = u.fx_nodes + [n for n in p.fx_nodes if n not in u.fx_nodes]
    u.aten_ops = u.aten_ops + [a for a in p.aten_ops if a not in u.aten_ops]
    u.stack_trace = u.stack_trace or p.stack_trace
    for b in p.reads:
        readers.setdefault(b, []).append(u)


def _in_space_of(p: ComputeNode, reader: ComputeNode) -> bool:
    """Whether `reader` iterates over `p`'s own space (the scheduler fuses them)."""
    return ir.same_sizes(ir.squeeze(_space(reader)), ir.squeeze(p.size))


def _one_space(graph: GraphIR, p: ComputeNode, readers: Sequence[ComputeNode]) -> bool:
    """Whether the readers, none in `p`'s own space, iterate over as many elements
    each: one kernel, as the scheduler fuses a reader with its split or viewed twin
    (ViT's q, k, v gradient: a clone for the weight gradient's matmul and, split in
    partials, the bias gradient's sum over it), loads `p`'s inputs once for both."""
    if any(_in_space_of(p, u) for u in readers):
        return False  # that reader fuses with p: the others would read p's inputs again
    return len({graph.hint(ir.numel(_space(u))) for u in readers}) == 1


def _large_reads(graph: GraphIR, p: ComputeNode, elements: Optional[int] = None) -> list[str]:
    """The buffers `p` reads that are not small next to it (or next to `elements`): a
    broadcast per-channel mean read again by every reader costs no traffic worth counting
    (BatchNorm's backward reads x - mean in its statistics kernel and its pointwise one)."""
    def numel(size: Sequence[Expr]) -> int:
        return graph.hint(ir.numel(size))

    mine = numel(p.size) if elements is None else elements
    return [b for b in p.reads if b not in graph.buffers or numel(graph.buffers[b].size) * SMALL_READ > mine]


def _loads_of(graph: GraphIR, p: ComputeNode, reader: ComputeNode) -> int:
    """How many times `reader` loads `p` per element it computes (its loads traced once
    while its body and reads stay: inlining into it changes its reads)."""
    return sum(1 for b, _ in ir.traced_loads(graph, reader) if b == p.name) or 1


def recompute_narrow_stores(graph: GraphIR, groups: Sequence[Any], output_sources: set[str], *,
                            costly_math: bool = False) -> list[Inlined]:
    """Producers a kernel stores only for readers in other kernels, recomputed there
    when that reads fewer bytes (module docstring). Mutates `graph`: those readers
    evaluate the producer (and the unstored producers it reads in its kernel); it stays
    for the members of its own kernel."""
    if any(isinstance(s, ExternNode) and _mutates(s) for s in graph.steps):
        return []
    kernel_of = {n.name: g for g in groups for n in g.nodes}
    stored = set().union(*(g.stores for g in groups)) if groups else set()
    by_name = {s.name: s for s in graph.steps}
    readers = _readers(graph)
    after_reduction = _after_reduction(graph)

    def recomputable(n: Any) -> bool:
        return (isinstance(n, ComputeNode) and not n.is_reduction and not after_reduction[n.name]
                and ir.dense_layout(n.size, n.stride, graph.size_hints))

    done: list[Inlined] = []
    for p in [s for s in graph.steps if isinstance(s, ComputeNode) and s.name in stored]:
        users = readers.get(p.name, [])
        home = kernel_of.get(p.name)
        outside = [u for u in users if kernel_of.get(u.name) is not home]
        if (not recomputable(p) or p.name in output_sources or not outside
                or any(not isinstance(u, ComputeNode) for u in users)
                or _cat_read_by_cat(p, outside)):  # as inline_pointwise refuses it
            continue
        chain = _unstored_chain(p, by_name, kernel_of, stored, recomputable)
        if chain is None:
            continue
        counts = [_counted(n) for n in chain]
        ops = sum(c.count for c in counts)
        if (costly_math and any(c.math for c in counts)
                or any(ops * _loads_of(graph, p, u) > MAX_OPS for u in outside)):
            continue
        read = _chain_bytes(graph, p, chain)
        evaluated, elements = _evaluations(graph, p, outside), graph.hint(ir.numel(p.size))
        if read > p.dtype.itemsize and not (evaluated < elements and read * evaluated <= p.dtype.itemsize * elements):
            continue
        for u in outside:
            for n in chain:  # p first: the others are what p (or one before) loads
                _inline_into(u, n, readers)
        readers[p.name] = [u for u in users if u not in outside]
        stored.discard(p.name)  # read only in its kernel now: a later producer reading it recomputes it too
        if read < p.dtype.itemsize:
            why = "its inputs are narrower than it (fewer bytes to read than to store and load it)"
        elif read == p.dtype.itemsize:
            why = "its inputs are no wider than it (as many bytes to read, and it is not written)"
        else:
            why = ("its readers compute it on part of its elements (reading its inputs there costs less "
                   "than writing it whole)")
        done.append(Inlined(p.name, p.aten_ops[0] if p.aten_ops else p.name, [u.name for u in outside], ops, False,
                            why))
    if done:  # what inline_pointwise left is read (it dropped the rest): only a recompute unreads
        drop_unread(graph, output_sources)
    return done


def drop_unread(graph: GraphIR, output_sources: set[str]) -> int:
    """Remove the compute steps no step reads and no output needs (a compute step has no
    effect but its buffer), last first so that what only they read goes too; returns how
    many. The scheduler made each a kernel that stores nothing: the producers recomputed
    elsewhere (BERT's and ResNet-50's training graphs launched 5 to 11 a step, each
    compiled at its first launch) and HF models' `torch.tensor([])` copies."""
    read: dict[str, int] = {}
    for s in graph.steps:
        for b in s.reads:
            read[b] = read.get(b, 0) + 1
    dead = []
    for s in reversed(graph.steps):
        if isinstance(s, ComputeNode) and not read.get(s.name) and s.name not in output_sources:
            dead.append(s)
            for b in s.reads:
                read[b] -= 1
    if dead:
        gone = {id(s) for s in dead}
        graph.steps[:] = [s for s in graph.steps if id(s) not in gone]
        for s in dead:
            graph.buffers.pop(s.name, None)
    return len(dead)


MAX_CHAIN = 4  # producers recomputed together (a cast feeding a subtraction, ...)


def _unstored_chain(p: ComputeNode, by_name: dict, kernel_of: dict, stored: set[str], ok: Any) -> Any:
    """`p` and the producers it reads in its kernel that are not stored (they must be
    recomputed with it), readers first; None when one cannot be or there are too many."""
    chain = [p]
    for n in chain:
        for b in sorted(n.reads):
            if b in kernel_of and b not in stored and all(c.name != b for c in chain):
                q = by_name.get(b)
                if not ok(q) or len(chain) >= MAX_CHAIN:
                    return None
                chain.append(q)
    return chain


def _chain_bytes(graph: GraphIR, p: ComputeNode, chain: list) -> int:
    """Bytes the chain loads from memory per element of `p`, not counting buffers much
    smaller than `p` (a per-channel mean, a scalar)."""
    mine = graph.hint(ir.numel(p.size))
    names = {n.name for n in chain}
    total = 0
    for n in chain:
        large = set(_large_reads(graph, n, mine)) - names
        for b, _ in ir.record_loads(n):
            if b in large:
                spec = graph.buffers.get(b)
                total += spec.dtype.itemsize if spec is not None else 8
    return total
