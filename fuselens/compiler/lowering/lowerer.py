"""Lowering: an ATen/prims FX graph (after AOTAutograd) to the loop IR.

Walks the FX graph in order. Each call is looked up in the registry (`lowering_of`):
pointwise ops and reductions become `ComputeNode`s, views become index maps
(no step at all), matmul/convolution/SDPA become `ExternNode(kind="extern")`,
and every op without a lowering (or with a dtype we do not generate code for)
becomes an `ExternNode(kind="fallback")` that runs ATen: always correct. Whether
each node was lowered is recorded in `GraphIR.lowered` with the reason when not.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional, Sequence

import sympy
import torch
import torch.fx

from fuselens.compiler import ir
from fuselens.compiler.ir import BufferSpec, ComputeNode, Expr, ExternNode, GraphIR, TensorValue
from fuselens.compiler.lowering.registry import LibraryCall, NotLowered, lowering_of
from fuselens.compiler.targets.base import runs_on_cuda, with_graph_device

# dtypes the code generators handle; anything else runs through ATen.
LOWERED_DTYPES = {
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}


def _is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def _random(node: torch.fx.Node) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


# uninitialised memory (an inverse permutation's buffer before index_put fills it, in a
# mixture-of-experts layer): ATen allocates it, which launches nothing
_ALLOCATIONS = {getattr(torch.ops.aten, op).default for op in ("empty_permuted", "empty_strided", "new_empty_strided")
                if hasattr(torch.ops.aten, op)}
_ALLOCATIONS |= {torch.ops.aten.empty.memory_format, torch.ops.aten.new_empty.default}


def _custom_op(target: Any) -> bool:
    """An op of a library's own namespace (`torch.library`: Hugging Face's grouped matmul
    for mixture-of-experts, a user's kernel, torch's functional collectives): a library
    call by its author's choice, not an ATen op left unlowered."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace not in ("aten", "prims", "fuselens")


def _meta(node: torch.fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


class Lowerer:
    """Builds a GraphIR from one FX graph; `lower()` does the whole walk."""

    def __init__(self, gm: torch.fx.GraphModule, options: Any) -> None:
        self.gm = gm
        self.options = options
        self.graph = GraphIR()
        self.current: Optional[torch.fx.Node] = None
        self._counter = 0
        # a graph on CUDA gets Triton kernels, which cannot write host memory: its CPU work (an
        # optimizer's step count kept on the CPU) runs in ATen. On CUDA: any value there, not
        # only an input (a graph may read CPU tensors and copy them to the GPU)
        self.on_cuda = runs_on_cuda(with_graph_device(gm, []))

    # -- helpers used by the op tables ------------------------------------
    def out_meta(self) -> Any:
        return _meta(self.current)

    def arg_meta(self, i: int) -> Any:
        """The fake tensor (or value) of the current node's i-th argument, None if it has none."""
        args = self.current.args if self.current is not None else ()
        return _meta(args[i]) if len(args) > i and isinstance(args[i], torch.fx.Node) else None

    def fresh(self, suffix: str) -> str:
        self._counter += 1
        return f"{self.current.name}_{suffix}{self._counter}"

    def add_compute(
        self,
        body: Callable,
        size: Sequence[Expr],
        dtype: torch.dtype,
        *,
        stride: Optional[Sequence[Expr]] = None,
        name: Optional[str] = None,
        reduction: Optional[str] = None,
        full_size: Sequence[Expr] = (),
        rdims: Sequence[int] = (),
        acc_dtype: Optional[torch.dtype] = None,
        unrolled: str = "",
    ) -> TensorValue:
        """Register a compute node for the current FX node; returns a value that loads it."""
        node = self.current
        size = list(size)
        name = name or node.name
        if stride is None:
            stride = ir.contiguous_strides(size)
        cn = ComputeNode(
            name=name,
            size=size,
            stride=list(stride),
            dtype=dtype,
            body=body,
            fx_nodes=[getattr(node, "fx_name", node.name)],  # a foreach element reports its foreach node
            aten_ops=[ir.op_name(node.target)],
            reduction=reduction,
            full_size=list(full_size),
            rdims=tuple(rdims),
            acc_dtype=acc_dtype,
            stack_trace=node.meta.get("stack_trace") or "",
            list_element=hasattr(node, "fx_name"),
            unrolled=unrolled,
        )
        loads = ir.record_loads(cn)
        cn.reads = {b for b, _ in loads}
        self.graph.steps.append(cn)
        ir.analysis_of(self.graph, cn)[2] = loads  # the passes and the scheduler ask for them again
        self.graph.buffers[name] = BufferSpec(name, size, list(stride), dtype)
        strides = list(stride)

        def load(ops: Any, idx: Sequence[Expr]) -> Any:
            if isinstance(ops, ir.IndexedLoads):  # a reader recomputing this node wants its logical index
                return ops.load_at(name, idx, strides)
            return ops.load(name, ir.offset_of(idx, strides))

        return TensorValue(size, dtype, load, name, True, strides)

    def out_stride(self, size: Sequence[Expr]) -> list[Expr]:
        """Eager's output strides (from the fake tensor) when they describe
        `size`, else contiguous."""
        val = self.out_meta()
        if _is_tensor(val) and len(val.shape) == len(size):
            st = [ir.sympify_size(s) for s in val.stride()]
            sz = [ir.sympify_size(s) for s in val.shape]
            if ir.same_sizes(sz, size) and ir.dense_layout(sz, st, self.graph.size_hints):
                return st
        return ir.contiguous_strides(size)

    # -- the walk ----------------------------------------------------------
    def lower(self) -> GraphIR:
        g = self.graph
        input_index = 0
        for node in self.gm.graph.nodes:
            self.current = node
            if node.op == "placeholder":
                self._placeholder(node, input_index)
                input_index += 1
            elif node.op == "call_function":
                if node.target is operator.getitem:
                    base = g.values[node.args[0].name]
                    g.values[node.name] = base[node.args[1]] if isinstance(base, (tuple, list)) else None
                    continue
                val = _meta(node)
                if not _is_tensor(val) and not isinstance(val, (tuple, list)):
                    # size arithmetic (operator.mul on SymInts, sym_size): a sympy expression
                    g.values[node.name] = _scalar_expr(val)
                    continue
                if self._literal_read_as_is(node):
                    g.values[node.name] = g.values[node.args[0].name]
                    continue
                if self.on_cuda and self._computes_on_cpu(node, val):
                    self._extern(node, "extern", "computes on the CPU, in a graph on CUDA")
                    continue
                if self.options.fallback_random and _random(node):
                    self._extern(node, "extern", "draws eager's random numbers (option fallback_random)")
                    continue
                fn = lowering_of(node.target) if self.options.lower else None
                if fn is None and node.target in _ALLOCATIONS:
                    self._extern(node, "extern", "an allocation: no kernel, its contents are undefined")
                    continue
                if fn is None and _custom_op(node.target):
                    self._extern(node, "extern", f"an op of the library '{node.target.namespace}', opaque to a "
                                                 "compiler: it runs as registered")
                    continue
                # a library call takes whatever ATen's kernel takes (an FFT's complex values)
                reason = "" if getattr(fn, "library_call", False) else self._unsupported_dtype(node)
                if fn is None and not reason:
                    reason = f"no lowering for {ir.op_name(node.target)}" if self.options.lower else "lowering disabled (option lower=False)"
                if fn is not None and not reason:
                    before = len(g.steps)
                    try:
                        args, kwargs = self.values(node.args), self.values(node.kwargs)
                        g.values[node.name] = fn(self, *args, **kwargs)
                        g.lowered[node.name] = True
                        continue
                    except LibraryCall as e:
                        del g.steps[before:]
                        self._extern(node, "extern", str(e))
                        continue
                    except NotLowered as e:
                        del g.steps[before:]
                        reason = str(e)
                self._extern(node, "fallback", reason)
            elif node.op == "output":
                self.outputs = node.args[0]
            elif node.op == "get_attr":
                self._get_attr(node)
        return g

    def _get_attr(self, node: torch.fx.Node) -> None:
        """A constant tensor of the graph module (AOT lifts few): a buffer the runtime holds."""
        g = self.graph
        val = getattr(self.gm, node.target)
        if not isinstance(val, torch.Tensor):
            g.values[node.name] = val
            return
        g.constants[node.name] = val
        g.values[node.name] = self._buffer_value(node.name, val)
        if val.dim() == 0 and val.dtype in LOWERED_DTYPES | {torch.bfloat16, torch.float16}:
            g.values[node.name] = _inline_literal(g.values[node.name], val)

    def _placeholder(self, node: torch.fx.Node, i: int) -> None:
        g = self.graph
        val = _meta(node)
        if _is_tensor(val):
            size = [ir.sympify_size(s) for s in val.shape]
            stride = [ir.sympify_size(s) for s in val.stride()]
            for d, (s, st) in enumerate(zip(val.shape, val.stride())):
                self._note_symbol(s, ("size", i, d))
                self._note_symbol(st, ("stride", i, d))
            spec = BufferSpec(node.name, size, stride, val.dtype)
            g.inputs.append(spec)
            g.buffers[node.name] = spec
            name = node.name
            g.values[node.name] = TensorValue(
                size, val.dtype, lambda ops, idx: ops.load(name, ir.offset_of(idx, stride)), name, True, stride
            )
        else:
            self._note_symbol(val, ("arg", i))
            g.inputs.append(BufferSpec(node.name, [], [], torch.int64))
            g.values[node.name] = _scalar_expr(val)

    def _note_symbol(self, s: Any, where: tuple) -> None:
        if isinstance(s, torch.SymInt):
            expr = s.node.expr
            if isinstance(expr, sympy.Symbol) and expr not in self.graph.symbols:
                self.graph.symbols[expr] = where
                hint = getattr(s.node, "hint", None)
                if hint is not None:
                    self.graph.size_hints[expr] = int(hint)

    def triton_target(self, v: Any) -> bool:
        """Whether kernels over tensor `v` come from the Triton generator (CUDA tensors,
        or option target="triton", which the interpreter tests use on CPU tensors)."""
        on_cuda = getattr(v, "device", torch.device("cpu")).type == "cuda"
        return on_cuda or getattr(self.options, "target", "cpp") == "triton"

    def _literal_read_as_is(self, node: torch.fx.Node) -> bool:
        """Whether `node` is the copy a literal (`torch.tensor(0)`) gets in the graph, only read:
        the literal itself serves. A functional graph never writes over it. As a copy on the
        CPU made by ATen (in a graph on CUDA), T5's `ids[..., 0] = start_id` had the CUDA
        kernels beside it read that copy, copied to the device at every launch (which a
        CUDA-graph capture refuses) instead of the literal's number. A graph output is a
        fresh tensor: its caller may write to it."""
        if node.target is not torch.ops.aten.lift_fresh_copy.default:
            return False
        src = node.args[0]
        return (isinstance(src, torch.fx.Node) and src.name in self.graph.constants
                and all(u.op != "output" for u in node.users))

    @staticmethod
    def _computes_on_cpu(node: torch.fx.Node, val: Any) -> bool:
        """Whether a node computes CPU tensors from CPU tensors (a copy from the device is
        the copy rule's: ATen's, with a finding)."""
        vals = val if isinstance(val, (tuple, list)) else [val]
        ins = [_meta(a) for a in node.all_input_nodes]
        return any(_is_tensor(v) and v.device.type == "cpu" for v in vals) \
            and not any(_is_tensor(v) and v.device.type != "cpu" for v in ins)

    def _unsupported_dtype(self, node: torch.fx.Node) -> str:
        vals = [_meta(a) for a in node.all_input_nodes] + [_meta(node)]
        flat: list[Any] = []
        for v in vals:
            flat.extend(v if isinstance(v, (tuple, list)) else [v])
        for v in flat:
            if _is_tensor(v):
                # bfloat16: computed in float, stored in 16 bits, on both targets; float16 on
                # Triton only: g++ 12 does not vectorize _Float16 conversions, and c10's software
                # ones made float16 softmax and layernorm kernels 2-3x slower than eager's
                triton = self.triton_target(v)
                half_ok = v.dtype == torch.bfloat16 or (triton and v.dtype == torch.float16)
                if v.dtype not in LOWERED_DTYPES and not half_ok:
                    return f"dtype {str(v.dtype).replace('torch.', '')} is not lowered"
                if v.device.type != "cpu" and not (v.device.type == "cuda" and triton):
                    return f"device {v.device.type}: the C++ code generator runs on CPU tensors"
        return ""

    def values(self, a: Any) -> Any:
        """An FX-level argument with its nodes replaced by their lowered values."""
        if isinstance(a, torch.fx.Node):
            return self.graph.values[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.values(x) for x in a)
        if isinstance(a, dict):
            return {k: self.values(v) for k, v in a.items()}
        return a

    def _extern(self, node: torch.fx.Node, kind: str, reason: str) -> None:
        """A library call / ATen fallback step; its outputs become run-time buffers."""
        g = self.graph
        step = ExternNode(node.name, node, kind, reason, stack_trace=node.meta.get("stack_trace") or "")
        step.reads = self.tensor_sources(node.all_input_nodes)
        g.steps.append(step)
        g.lowered[node.name] = kind == "extern"
        if kind == "fallback":
            g.fallback_reasons[node.name] = reason
        val = _meta(node)
        if isinstance(val, (tuple, list)):
            g.values[node.name] = tuple(
                self._buffer_value(f"{node.name}_out{i}", v) if _is_tensor(v) else None for i, v in enumerate(val)
            )
            step.outputs = [f"{node.name}_out{i}" for i, v in enumerate(val) if _is_tensor(v)]
        elif _is_tensor(val):
            g.values[node.name] = self._buffer_value(node.name, val)
            step.outputs = [node.name]
        else:
            g.values[node.name] = None

    def _buffer_value(self, name: str, val: torch.Tensor) -> TensorValue:
        size = [ir.sympify_size(s) for s in val.shape]
        stride = [ir.sympify_size(s) for s in val.stride()]
        self.graph.buffers[name] = BufferSpec(name, size, stride, val.dtype)
        return TensorValue(
            size, val.dtype, lambda ops, idx: ops.load(name, ir.offset_of(idx, stride)), name, True, stride
        )

    def tensor_sources(self, nodes: Sequence[torch.fx.Node]) -> set[str]:
        """The buffers these FX values read (through views)."""
        out: set[str] = set()
        for n in nodes:
            v = self.graph.values.get(n.name)
            for tv in v if isinstance(v, (tuple, list)) else [v]:
                if isinstance(tv, TensorValue):
                    out |= sources_of(tv)
        return out

    def lower_as(self, stand_in: Any, lowering: Callable[[], Any]) -> Any:
        """`lowering()` run with `stand_in` as the current node: a lowering written for one FX
        node (its output's fake tensor, its buffer name) applied to a part of another, a
        foreach op's element with its plain op's lowering (foreach.py)."""
        node, self.current = self.current, stand_in
        try:
            return lowering()
        finally:
            self.current = node

    def extern(self, reason: str) -> Any:
        """Used by the op tables for library calls (mm, conv, sdpa)."""
        self._extern(self.current, "extern", reason)
        return self.graph.values[self.current.name]


def _inline_literal(buffer: TensorValue, val: torch.Tensor) -> TensorValue:
    """A 0-d constant of the graph (a literal: `x[..., 0] = 5` lifts `torch.tensor(5)`,
    kept on the CPU) as its number in every kernel that reads it. As a buffer, a CUDA
    kernel's launch copied it to the device at every call, which a CUDA-graph capture
    refuses (T5's `_shift_right`: its graph ran without CUDA graphs). Library calls still
    get the tensor: the value keeps the buffer as its source."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # AOTAutograd calls the backend under its fake mode; a literal is real
        number = val.item()
    dtype = val.dtype
    return TensorValue([], dtype, lambda ops, idx: ops.constant(number, dtype), buffer.source, True, [])


def sources_of(tv: TensorValue) -> set[str]:
    rec = ir.LoadRecorder()
    tv.loader(rec, [ir.index_var("d", i) for i in range(len(tv.size))])
    return {b for b, _ in rec.loads}


def _scalar_expr(v: Any) -> Any:
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return sympy.sympify(v.node.expr)
    return v

