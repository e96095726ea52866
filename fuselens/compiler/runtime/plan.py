"""Turn a Schedule into the runtime plan: calls in order, allocations with
symbolic sizes, lazily re-created views, and a Free right after each buffer's
last use (views and aliasing ATen outputs keep their base alive)."""

from __future__ import annotations

from typing import Any, Optional

import sympy
import torch
import torch.fx

from fuselens.compiler import ir
from fuselens.compiler.ir import ExternNode, GraphIR, TensorValue, released_inputs
from fuselens.compiler.runtime.buffer_reuse import StorageFacts
from fuselens.compiler.runtime.interpreter import (ExternCall, Free, GraphRunner, KernelCall, StepOrigin, SymEval,
                                                  alloc_nbytes)
from fuselens.compiler.runtime.plan_order import PlanOrder, buffers_in, step_buffers
from fuselens.compiler.kernel_group import KernelGroup
from fuselens.compiler.scheduler import Schedule
from fuselens.kernel_timing import KernelTimer


def _fresh_outputs(target: Any) -> bool:
    """ATen ops whose outputs never alias their inputs (safe to recycle)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    return all(r.alias_info is None for r in schema.returns)


# Out-of-place library calls whose result is their first argument, copied and then updated,
# and the in-place form that updates the argument itself (runtime/plan.py _externs_in_place).
_aten = torch.ops.aten
_IN_PLACE_FORMS = {_aten.index_add.default: _aten.index_add_.default,
                   _aten.index_put.default: _aten.index_put_.default,
                   _aten.index_copy.default: _aten.index_copy_.default,
                   _aten.scatter.src: _aten.scatter_.src,
                   _aten.scatter.value: _aten.scatter_.value,
                   _aten.scatter_add.default: _aten.scatter_add_.default}


def _same_tensor_layout(g: GraphIR, a: str, b: str) -> bool:
    """Whether buffers `a` and `b` have one dtype, sizes and strides: the in-place form's
    result is its argument, where the out-of-place one's is a copy laid out by its meta."""
    x, y = g.buffers[a], g.buffers[b]
    return x.dtype == y.dtype and ir.same_layout(x, y)


# Library calls whose result is a fresh contiguous tensor, as their meta functions say.
_CONTIGUOUS_RESULTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
                       torch.ops.aten.baddbmm.default}


def reinterpret_view(base: torch.Tensor, size: tuple, stride: tuple, shift: int) -> torch.Tensor:
    """A view of `base` at `shift` elements past its own offset: what the generated wrapper's
    `_reinterpret` does, for the interpreter."""
    return base.as_strided(size, stride, base.storage_offset() + shift)


class Planner:
    def __init__(self, graph: GraphIR, sched: Schedule, kernels: dict, lib: Any, outputs: Any,
                 timer: Optional[KernelTimer]) -> None:
        self.g = graph
        self.sched = sched
        self.kernels = kernels
        self.lib = lib
        self.fx_outputs = outputs
        self.timer = timer  # times the plan's kernels and library calls on the host clock
        syms = sorted(graph.symbols, key=lambda s: s.name)
        self.symeval = SymEval(syms)
        self.plan: list[Any] = []
        self.views: dict[str, ExternCall] = {}  # each view re-created, and the step that does it
        self.alias_parent: dict[str, str] = {}
        self.kernel_allocated: set[str] = set()
        self._extern_took: dict[str, str] = {}  # an in-place library call's output -> the buffer it updated
        # buffers whose run-time layout is the traced one: graph inputs (Dynamo guards their
        # strides), kernel outputs (allocated by us), matmul results (always contiguous) and
        # views of those; views of anything else (an attention output, a fallback) go through ATen
        self.layout_known: set[str] = {i.name for i in graph.inputs}

    def _static_view(self, node: torch.fx.Node, args: Any) -> Optional[tuple]:
        """(size, stride, offset from the base) of a view of a known-layout buffer, static only."""
        schema = getattr(node.target, "_schema", None)
        if schema is None or len(schema.returns) != 1 or schema.returns[0].alias_info is None:
            return None  # not an ATen view (flip, for one, is an index map here but a copy in ATen)
        base = node.args[0] if node.args else None
        val, base_val = node.meta.get("val"), getattr(base, "meta", {}).get("val")
        if not (isinstance(val, torch.Tensor) and isinstance(base_val, torch.Tensor)):
            return None
        if not (isinstance(args[0], tuple) and len(args[0]) == 2 and args[0][0] == "buf"
                and args[0][1] in self.layout_known):
            return None
        facts = (*val.shape, *val.stride(), val.storage_offset(), base_val.storage_offset())
        if not all(isinstance(x, int) for x in facts):
            return None  # symbolic: int() would specialize the graph on this call's sizes
        size, stride = tuple(val.shape), tuple(val.stride())
        return size, stride, val.storage_offset() - base_val.storage_offset()

    def slot(self, e: Any) -> int:
        return self.symeval.add(e)

    def _root(self, n: str) -> str:
        while n in self.alias_parent:
            n = self.alias_parent[n]
        return n

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._root(a), self._root(b)
        if ra != rb:
            self.alias_parent[ra] = rb

    def ref(self, a: Any) -> Any:
        """An FX argument as a run-time reference: ("buf", name), ("sym", slot) or a constant."""
        if isinstance(a, torch.fx.Node):
            v = self.g.values.get(a.name)
            if isinstance(v, TensorValue) and v.direct:
                return ("buf", v.source)
            if isinstance(v, sympy.Expr):
                return ("sym", self.slot(v)) if not v.is_Number else (int(v) if v.is_Integer else float(v))
            if v is None and a.name in self.g.buffers:
                return ("buf", a.name)
            if isinstance(v, tuple) and all(isinstance(x, TensorValue) and x.direct for x in v if x is not None):
                return tuple(("buf", x.source) if x is not None else None for x in v)
            return ("buf", self.view(a))
        if isinstance(a, (list, tuple)):
            return type(a)(self.ref(x) for x in a)
        if isinstance(a, dict):
            return {k: self.ref(v) for k, v in a.items()}
        if isinstance(a, (torch.SymInt, torch.SymFloat)):
            return ("sym", self.slot(a.node.expr))
        return a

    def view(self, node: torch.fx.Node) -> str:
        """Re-create a lowered view (or a tuple of views) with ATen, once."""
        name = node.name
        if name not in self.views:
            args = self.ref(node.args)
            kwargs = self.ref(node.kwargs)
            layout = self._static_view(node, args)
            target = node.target
            if layout is not None:
                self.layout_known.add(name)
                parent = self.views.get(args[0][1])
                if parent is not None and parent.reinterpret is not None:
                    # a view of a view (BatchNorm's saved mean: squeeze, then three unsqueezes):
                    # re-created from the first view's base in one step. Each link was a
                    # reinterpret a call, most of them never read but by the next link
                    size, stride, shift = layout
                    layout = (size, stride, parent.reinterpret[2] + shift)
                    target, args, kwargs = reinterpret_view, (parent.args[0], size, stride, layout[2]), {}
            step = ExternCall(name, target, args, kwargs, name, reinterpret=layout)
            self.views[name] = step
            self.plan.append(step)
            for leaf in buffers_in(args):
                self._union(name, leaf)
        return name

    def build(self) -> GraphRunner:
        g = self.g
        for unit in self.sched.units:
            if isinstance(unit, KernelGroup):
                ks = self.kernels[unit.name]
                alloc = []
                for o in ks.outputs:
                    spec = g.buffers[o]
                    alloc.append((o, self.slot(tuple(spec.size)), self.slot(tuple(spec.stride)), spec.dtype))
                    self.kernel_allocated.add(o)
                    self.layout_known.add(o)
                fn = getattr(self.lib, unit.name)
                import ctypes

                fn.argtypes = [ctypes.c_void_p] * len(ks.buffers) + [ctypes.c_int64] * len(ks.symbols)
                fn.restype = None
                self.plan.append(KernelCall(unit.name, fn, ks.buffers, ks.outputs, alloc, [s.name for s in ks.symbols]))
            else:
                self._extern(unit)
        outputs = [self.ref(o) for o in (self.fx_outputs if isinstance(self.fx_outputs, (list, tuple)) else [self.fx_outputs])]
        self._drop_unread_views(set(buffers_in(outputs)))
        self._reorder_for_memory(set(buffers_in(outputs)))
        in_place = self._mutate_inputs()
        self._insert_frees(outputs)
        taken = self._reuse_dying_inputs() | self._externs_in_place()
        if self.timer is not None:
            # library calls (mm, conv, fallbacks) are timed too, under their Kernel event name
            from fuselens.compiler.explain import extern_kernel_names

            names = extern_kernel_names(self.sched)
            for step in self.plan:
                if isinstance(step, ExternCall) and step.name in names and step.name not in self.views:
                    step.timed = names[step.name]
        # tuples of sizes/strides are single slots: flatten in SymEval by making each a tuple expr
        self.symeval.exprs = [e if not isinstance(e, tuple) else _TupleExpr(e) for e in self.symeval.exprs]
        symbol_sources = {}
        for s, src in g.symbols.items():
            if src[0] == "arg":
                symbol_sources[s.name] = ("arg", g.inputs[src[1]].name)
            else:
                symbol_sources[s.name] = (src[0], g.inputs[src[1]].name, src[2])
        # buffers the graph owns whole (a kernel's output, a matmul's result) whose storage a later
        # allocation may take over once they die: a Free drops a root with all its views
        # (`_insert_frees`), so a viewed one counts too (a Linear's result reshaped, ConvNeXt's and
        # every transformer's: on the CPU, where only kernels' unviewed outputs counted, ConvNeXt-T
        # made 43 fresh buffers a call and took over one); never one an output or a mutated input is on
        matmuls = {st.outputs for st in self.plan if isinstance(st, ExternCall) and st.out_layout is not None}
        kept = {self._root(b) for b in self._output_bufs | in_place}
        reusable = {n for n in self.kernel_allocated | matmuls if self._root(n) == n} - taken - kept
        runner = GraphRunner(self.plan, [i.name for i in g.inputs], symbol_sources, _compile_slots(self.symeval),
                             outputs, reusable, self.timer, constants=g.constants)
        runner.origins = self._origins()
        names = [i.name for i in g.inputs]
        runner.mutated_inputs = sorted(names.index(d) for d in g.input_mutations.values())
        if runner._static_slots is not None:
            runner.storage = self._storage_facts(taken | in_place | self._output_bufs)
        return runner

    def _drop_unread_views(self, outputs: set[str]) -> None:
        """Views that nothing reads and the graph does not return: the links of a chain
        whose last view was re-created from its base."""
        read = set(outputs)
        keep: list[Any] = []
        for step in reversed(self.plan):
            if isinstance(step, ExternCall) and step.reinterpret is not None and step.outputs not in read:
                continue
            keep.append(step)
            read.update(step_buffers(step))
        self.plan[:] = reversed(keep)

    def _origins(self) -> dict[str, StepOrigin]:
        """Each kernel's and library call's ATen ops and source line, by step name."""
        origins: dict[str, StepOrigin] = {}
        for unit in self.sched.units:
            if isinstance(unit, KernelGroup):
                stack = next((n.stack_trace for n in unit.nodes if n.stack_trace), "")
                origins[unit.name] = StepOrigin(tuple(o for n in unit.nodes for o in n.aten_ops), stack)
            elif isinstance(unit, ExternNode):
                origins[unit.fx_node.name] = StepOrigin((ir.op_name(unit.fx_node.target),), unit.stack_trace)
        return origins

    def _storage_facts(self, kept: set[str]) -> StorageFacts:
        """The byte sizes and hand-on rules buffer_reuse.py plans a static graph's reuse by.
        A storage may be handed on when the graph owns it whole: a kernel's output or a
        matmul's result, neither an output nor written in place, dead with all its views
        (a Free drops a buffer's aliases together). `kept`: buffers whose storage outlives
        them (taken over in place, graph outputs, mutated inputs)."""
        nbytes, dtypes, layouts = {}, {}, {}
        for name, spec in self.g.buffers.items():
            layout = _static_layout(spec)
            if self._root(name) == name and layout is not None:
                nbytes[name] = alloc_nbytes(*layout, spec.dtype)
                dtypes[name], layouts[name] = spec.dtype, layout
        keep = {self._root(b) for b in self._output_bufs} | kept
        matmuls = {st.outputs for st in self.plan if isinstance(st, ExternCall) and st.out_layout is not None}
        owned = (self.kernel_allocated | matmuls) - keep
        took = {out: src for st in self.plan if isinstance(st, KernelCall) for out, src in st.reuse.items()}
        took.update(self._extern_took)
        inputs = {self._root(i.name) for i in self.g.inputs}
        return StorageFacts(nbytes, dtypes, {n for n in owned if n in nbytes},
                            {n for n in self.kernel_allocated | matmuls if n in nbytes}, took, layouts,
                            sum(nbytes.get(n, 0) for n in inputs))

    def _extern(self, e: ExternNode) -> None:
        node = e.fx_node
        args, kwargs = self.ref(node.args), self.ref(node.kwargs)
        v = self.g.values.get(node.name)
        if isinstance(v, tuple):
            outs: Any = [x.source if isinstance(x, TensorValue) else None for x in v]
        else:
            outs = node.name
        dtypes = {o: self.g.buffers[o].dtype for o in (outs if isinstance(outs, list) else [outs])
                  if o is not None and o in self.g.buffers}
        step = ExternCall(node.name, node.target, args, kwargs, outs, dtypes)
        self.plan.append(step)
        if node.target in _CONTIGUOUS_RESULTS and isinstance(outs, str):
            self.layout_known.add(outs)
            step.out_layout = self._out_layout(outs, node)
        if not _fresh_outputs(node.target):
            for o in outs if isinstance(outs, list) else [outs]:
                if o is not None:
                    for leaf in buffers_in((args, kwargs)):
                        self._union(o, leaf)

    def _out_layout(self, out: str, node: torch.fx.Node) -> Optional[tuple]:
        """(size, stride) of a matmul's result that a dead buffer may be given for, through
        `out=`: static, dense, of its operands' dtype (an `out=` of another dtype is an error)."""
        spec = self.g.buffers.get(out)
        layout = None if spec is None else _static_layout(spec)
        if layout is None or layout[1] != _contiguous_strides(layout[0]):
            return None
        operands = [a.meta.get("val") for a in node.all_input_nodes]
        if not operands or any(getattr(v, "dtype", None) != spec.dtype for v in operands):
            return None
        return layout

    def _mutate_inputs(self) -> set[str]:
        """Where each input mutation kept in the graph lands. The kernel computing the new
        value stores it straight into the input when nothing after that kernel reads the
        input's old value and no member of the kernel reads the input at another element
        than the one it overwrites; otherwise an explicit `copy_` runs after the graph's
        last step. Returns the nodes stored in place (their buffer is the input's)."""
        in_place: set[str] = set()
        # the last step touching each buffer (by root), kept up to date as steps change
        # below: asking every later step for each mutation was quadratic (ResNet-50's
        # training forward: 159 running statistics over 400 steps)
        last: dict[str, int] = {}
        computed_at: dict[str, int] = {}
        for i, s in enumerate(self.plan):
            for b in step_buffers(s):
                last[self._root(b)] = i
            if isinstance(s, KernelCall):
                for o in s.outputs:
                    computed_at.setdefault(o, i)
        for node, dst in self.g.input_mutations.items():
            at, root = computed_at[node], self._root(dst)
            group = self.sched.group_of[node]
            member = next(m for m in group.nodes if m.name == node)
            if last.get(root, -1) <= at and _reads_only_overwritten_element(group, member, dst, self.g):
                self.plan[at].reuse[node] = dst
                last[root] = at  # nothing later touched it
                in_place.add(node)
            else:
                self.plan.append(ExternCall(f"{node}_into_input", torch.ops.aten.copy_.default,
                                            (("buf", dst), ("buf", node)), {}, f"{node}_into_input"))
                for b in (dst, node):
                    last[self._root(b)] = len(self.plan) - 1
        return in_place

    def _reuse_dying_inputs(self) -> set[str]:
        """Let a pointwise kernel write its output over an input that dies at this
        very call (the codegen lists the safe pairs in `KernelSource.inplace`): no
        fresh allocation (page faults, memory traffic) and a lower peak than eager,
        e.g. the GELU after an addmm runs in the addmm's buffer. Returns the inputs
        whose storage was taken (they must not go back to the free pool)."""
        taken: set[str] = set()
        protected, aliased = self._not_takeable()
        for i, step in enumerate(self.plan):
            if not isinstance(step, KernelCall):
                continue
            ks = self.kernels.get(step.name)
            inplace = getattr(ks, "inplace", None) or {}
            nxt = self.plan[i + 1] if i + 1 < len(self.plan) else None
            dying = set(nxt.names) if isinstance(nxt, Free) else set()
            for out, cands in inplace.items():
                if out in step.reuse:  # stored into a mutated graph input already
                    continue
                for c in cands:
                    if c in dying and c not in protected and c not in aliased and c not in taken:
                        step.reuse[out] = c
                        taken.add(c)
                        if not ir.same_layout(self.g.buffers[out], self.g.buffers[c]):
                            step.restride.add(out)  # the same memory under other sizes (codegen checked)
                        break
        return taken

    def _reorder_for_memory(self, outputs: set[str]) -> None:
        """Steps hoisted and sunk for a lower peak (plan_order.py)."""
        order = self._memory_order(outputs)
        order.hoist()
        order.sink()
        self.plan = order.plan

    def _memory_order(self, outputs: set[str]) -> PlanOrder:
        """The plan with what each step touches and what the graph frees: all but its
        outputs and constants, and the inputs it may release."""
        keep = {self._root(o) for o in outputs} | outputs | set(self.g.constants)
        inputs = {x.name for x in self.g.inputs}
        released = released_inputs(self.g)
        freeable = {n for n in self.g.buffers if n not in keep and (n not in inputs or n in released)}
        return PlanOrder(self.plan, self.g, self._root, set(self.views), freeable)

    def _not_takeable(self) -> tuple[set[str], set[str]]:
        """Buffers no step may write over: graph inputs, constants and outputs, and
        buffers some view or aliasing library call shares."""
        protected = {i.name for i in self.g.inputs} | set(self.g.constants) | self._output_bufs
        return protected, set(self.alias_parent) | {self._root(k) for k in self.alias_parent}

    def _externs_in_place(self) -> set[str]:
        """A library call that copies its first argument and updates the copy
        (`_IN_PLACE_FORMS`) updates that argument itself when it is a buffer of ours dying
        at the call: an embedding's gradient is index_add over a zero-filled table made
        for it alone, and index_add first copies the zeros (Llama: 131 MB a training step);
        a mixture-of-experts layer inverts its routing permutation with index_put into an
        uninitialised buffer, which index_put copied first (a launch a layer). Ours: a
        kernel's output, or a library call's result that owns its storage (an allocation,
        a matmul). Done here, not in the FX graph: an in-place op there changed how the
        backward was scheduled. Returns the buffers taken (they must not go back to the
        free pool)."""
        taken: set[str] = set()
        protected, aliased = self._not_takeable()
        owned = set(self.kernel_allocated)
        owned |= {st.outputs for st in self.plan if isinstance(st, ExternCall) and isinstance(st.outputs, str)
                  and st.reinterpret is None and _fresh_outputs(st.target)}
        for i, step in enumerate(self.plan):
            in_place = _IN_PLACE_FORMS.get(step.target) if isinstance(step, ExternCall) else None
            if in_place is None or not isinstance(step.outputs, str) or step.outputs in aliased:
                continue
            first = step.args[0] if step.args else None
            nxt = self.plan[i + 1] if i + 1 < len(self.plan) else None
            if not (isinstance(first, tuple) and len(first) == 2 and first[0] == "buf"):
                continue
            b = first[1]
            if (isinstance(nxt, Free) and b in nxt.names and b in owned and b not in protected
                    and b not in aliased and b not in taken and b in self.g.buffers
                    and step.outputs in self.g.buffers and _same_tensor_layout(self.g, b, step.outputs)):
                step.target = in_place
                step.out_layout = None
                self._extern_took[step.outputs] = b
                taken |= {b, step.outputs}
        return taken

    def _insert_frees(self, outputs: list) -> None:
        self._output_bufs = set()
        for b in buffers_in(outputs):
            self._output_bufs.add(b)
        keep = {self._root(b) for b in self._output_bufs}
        last: dict[str, int] = {}
        for i, step in enumerate(self.plan):
            for n in step_buffers(step):
                last[self._root(n)] = i
                last[n] = max(last.get(n, -1), i)
        groups: dict[str, list[str]] = {}
        for n in last:
            groups.setdefault(self._root(n), []).append(n)
        frees: dict[int, list[str]] = {}
        for root, members in groups.items():
            if root in keep:
                continue
            at = max(last[m] for m in members)
            frees.setdefault(at, []).extend(members)
        new_plan: list[Any] = []
        for i, step in enumerate(self.plan):
            new_plan.append(step)
            if i in frees:
                new_plan.append(Free(sorted(set(frees[i]))))
        self.plan = new_plan


def _static_layout(spec: ir.BufferSpec) -> Optional[tuple[tuple, tuple]]:
    """(size, stride) of a buffer whose sizes and strides are numbers and which starts
    its storage; None otherwise."""
    facts = (*spec.size, *spec.stride, spec.offset)
    if not all(isinstance(x, int) or getattr(x, "is_Integer", False) for x in facts) or spec.offset != 0:
        return None
    return tuple(int(x) for x in spec.size), tuple(int(x) for x in spec.stride)


def _contiguous_strides(size: tuple) -> tuple:
    strides, acc = [], 1
    for n in reversed(size):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


class _TupleExpr:
    def __init__(self, items: tuple) -> None:
        self.items = items


def _compile_slots(se: SymEval) -> Any:
    """Slots are single expressions or tuples of expressions (sizes, strides)."""
    flat = SymEval(se.symbols)
    shape: list[Any] = []
    for e in se.exprs:
        if isinstance(e, _TupleExpr):
            shape.append([flat.add(x) for x in e.items])
        else:
            shape.append(flat.add(e))
    fn = flat.compile()

    def evaluate(env: dict) -> list:
        vals = fn(env)
        return [[vals[i] for i in s] if isinstance(s, list) else vals[s] for s in shape]

    return evaluate


def _reads_only_overwritten_element(group: KernelGroup, node: ir.ComputeNode, dst: str, graph: GraphIR) -> bool:
    """Whether `node` may store into input `dst` inside its kernel: every member that
    loads `dst` comes before `node`, is pointwise over `node`'s sizes, at `node`'s level
    of the kernel, and loads exactly the element `node` overwrites (so each element is
    read before it is written, and by the iteration that writes it)."""
    dvars = [ir.index_var("d", i) for i in range(len(node.size))]
    own = ir.offset_of(dvars, graph.buffers[dst].stride)
    level = group.level(node)
    for m in group.nodes:
        loads = [e for b, e in ir.record_loads(m) if b == dst]
        if m is node:
            if loads and not all(ir.same_expr(e, own) for e in loads):
                return False
            break
        if not loads:
            continue
        if (m.is_reduction or group.level(m) != level or not ir.same_sizes(m.size, node.size)
                or (group.has_reduction and level == "full")  # the kernel's passes could reorder them
                or not all(ir.same_expr(e, own) for e in loads)):
            return False
    else:
        return False
    return not any(b == dst for m in group.nodes[group.nodes.index(node) + 1:] for b, _ in ir.record_loads(m))


def make_runner(graph: GraphIR, sched: Schedule, kernels: dict, lib: Any, outputs: Any,
                timer: Optional[KernelTimer] = None) -> GraphRunner:
    """The graph's plan in a GraphRunner; `timer` times its kernels and library calls on the host clock."""
    return Planner(graph, sched, kernels, lib, outputs, timer).build()
