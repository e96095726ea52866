"""Work an inference graph does on its module state alone, done once while that state is unchanged.

What an inference graph computes from parameters and buffers only comes out the same at every
call until one of them changes: a convolution's weight copied channels-last for oneDNN or cuDNN
(ResNet-50 inference on a 2-core CPU: 18 weights, 4.9 ms of a 93 ms call, for Inductor too), a
BatchNorm's `weight * rsqrt(running_var + eps)` and the shift with it, which the kernels after a
convolution otherwise compute for every element. `split_module_state_prologue` moves those
computations out of the graph into a prologue, whose results the graph then takes as inputs of
its own; `PrologueRunner` runs the prologue at the first call, and again only when a tensor it
reads changed: another address (`.data =`, a swapped buffer) or another version (any in-place
update: an optimizer's step, `load_state_dict`, `fill_`). Inductor's freezing folds the same
work, on the promise that parameters never change; here the promise is autograd's own: a write
through `.data` (`w.data.mul_(0.9)`, which makes a tensor with a version counter of its own) is
not seen, as autograd's checks of saved tensors do not see it. Such a program updates the tensor
itself under `torch.no_grad()`, assigns `.data` anew (another address), or sets the option to "never".

The results stay allocated between calls, beside the state they come from: by default only on
CPU tensors (option `module_state_once`), where they save most; on the GPU, ResNet-50's folded
bf16 weights saved 6% of a call and raised its peak 22 MB above Inductor's (H200).

Not for training graphs (their weights change at every step, and autograd needs the graph of
them), nor under CUDA graphs (a replay reads module state in place and would not see a change
the prologue must follow), nor for a state the graph itself mutates. A result the graph returns
stays in the graph (the caller would get the cached tensor), and results that would take more
memory than the state they are computed from (an `expand` made real) stay too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch
import torch.fx

from fuselens.compiler import ir
from fuselens.compiler.constant_folding import _data_inputs, _pure, _static_tensor
from fuselens.compiler.graph_passes import GraphRewrite


@dataclasses.dataclass
class Prologue:
    """The module-state computations cut out of a graph: `module(*state)` returns the values
    the graph's last `len(expected)` inputs take, where state is the call's inputs at `reads`."""

    module: torch.fx.GraphModule
    reads: list[int]
    expected: list[tuple[tuple, tuple, torch.dtype]]  # each result's traced (shape, stride, dtype)


def split_module_state_prologue(gm: torch.fx.GraphModule,
                                static_indices: Sequence[int]) -> tuple[Optional[Prologue], list[GraphRewrite]]:
    """Cut the computations of `gm` that read only the inputs at `static_indices` (parameters and
    buffers) and constants into a prologue; `gm` then reads their results as extra inputs,
    appended after its own. (None, []) when there is nothing worth cutting."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    mutated = {n.args[0] for n in gm.graph.nodes
               if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target._schema.is_mutable and n.args and isinstance(n.args[0], torch.fx.Node)}
    state = {placeholders[i] for i in static_indices
             if i < len(placeholders) and placeholders[i] not in mutated
             and isinstance(placeholders[i].meta.get("val"), torch.Tensor)}
    if not state:
        return None, []
    known: set[torch.fx.Node] = set(state)  # computed from module state and constants alone
    for n in gm.graph.nodes:
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.Tensor):
            known.add(n)
        elif n.op == "call_function" and _pure(n) and _static_tensor(n.meta.get("val")):
            inputs: list[torch.fx.Node] = []
            torch.fx.node.map_arg((n.args, n.kwargs), inputs.append)
            if inputs and all(i in known for i in inputs):
                known.add(n)
    cut: dict[torch.fx.Node, int] = {}  # node -> the ops computing it
    looked: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        if n in known and n.op == "call_function" and any(u not in known for u in n.users):
            _choose(n, known, state, cut, looked)
    if not cut:
        return None, []
    return _split(gm, {n: cut[n] for n in gm.graph.nodes if n in cut}, known, placeholders)


def _choose(n: torch.fx.Node, known: set, state: set, cut: dict, looked: set) -> None:
    """Cut `n` where that saves work and no memory, else look at what it reads."""
    if n in looked or n.op != "call_function":
        return
    looked.add(n)
    ancestors = _ancestors(n, known)
    sources = ancestors & state
    if not sources:
        return  # literals alone: constant_folding.py's to fold, at compile time
    returned = any(u.op == "output" for u in n.users)
    grows = _bytes(n.meta["val"]) > sum(_bytes(p.meta["val"]) for p in sources)
    if returned or grows or ir.returns_alias(n):
        for i in _data_inputs(n):
            if i in known:
                _choose(i, known, state, cut, looked)
        return
    ops = _work(ancestors)
    if ops:
        cut[n] = ops


def _ancestors(n: torch.fx.Node, known: set) -> set[torch.fx.Node]:
    """`n` and the module state and constants it is computed from, transitively."""
    seen, stack = set(), [n]
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.op == "call_function":
            stack.extend(i for i in _data_inputs(m) if i in known)
    return seen


def _work(nodes: set[torch.fx.Node]) -> int:
    """The ops among `nodes` that compute (views take no work)."""
    return sum(1 for m in nodes if m.op == "call_function" and not ir.returns_alias(m))


def _bytes(val: Any) -> int:
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _split(gm: torch.fx.GraphModule, cut: dict[torch.fx.Node, int], known: set,
           placeholders: list[torch.fx.Node]) -> tuple[Prologue, list[GraphRewrite]]:
    cone: set[torch.fx.Node] = set()  # what the prologue computes: the cut values and what they read
    stack = list(cut)
    while stack:
        m = stack.pop()
        if m in cone:
            continue
        cone.add(m)
        torch.fx.node.map_arg((m.args, m.kwargs), lambda a: stack.append(a) if a in known else None)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    reads = [i for i, p in enumerate(placeholders) if p in cone]
    for i in reads:
        env[placeholders[i]] = graph.placeholder(placeholders[i].name)
    for n in gm.graph.nodes:
        if n in cone and n.op != "placeholder":
            env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(tuple(env[n] for n in cut))
    module = torch.fx.GraphModule(gm, graph)
    expected = []
    rewrites = []
    last = placeholders[-1]
    for k, (n, ops) in enumerate(cut.items()):
        val = n.meta["val"]
        expected.append((tuple(val.shape), tuple(val.stride()), val.dtype))
        with gm.graph.inserting_after(last):
            p = gm.graph.placeholder(f"module_state_{k}")
        last = p
        p.meta.update({key: n.meta[key] for key in ("val", "tensor_meta", "stack_trace") if key in n.meta})
        n.replace_all_uses_with(p, delete_user_cb=lambda u: u not in cone)
        shape = "x".join(str(s) for s in val.shape) or "0-d"
        rewrites.append(GraphRewrite(
            "module-state-prologue", n.name,
            f"computed once from the module's parameters and buffers, not at every call: {ops} "
            f"operation{'s' * (ops != 1)} (a {shape} {str(val.dtype).removeprefix('torch.')} tensor), "
            "again only when one of them changes (in place or moved; not through `.data`)"))
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return Prologue(module, reads, expected), rewrites


class PrologueRunner:
    """A compiled graph with its module-state prologue: the prologue's results, computed again
    only when a tensor it reads has moved or changed, appended to each call's inputs."""

    _boxed_call = True

    def __init__(self, runner: Any, prologue: Prologue) -> None:
        self.runner = runner
        self.prologue = prologue
        self._key: Optional[list] = None  # the state's (address, version) the values are of
        self._values: list[torch.Tensor] = []

    def __call__(self, args: list) -> Any:
        state = [args[i] for i in self.prologue.reads]
        try:
            key = [(t.data_ptr(), t._version) for t in state]
        except RuntimeError:  # an inference tensor (made under inference_mode) has no version: no cache
            key = None
        if key is None or key != self._key:
            self._values = self._compute(state)
            self._key = key
        args.extend(self._values)
        del state
        return self.runner(args)

    def _compute(self, state: list) -> list[torch.Tensor]:
        with torch.no_grad():
            out = list(self.prologue.module(*state))
        for k, (shape, stride, dtype) in enumerate(self.prologue.expected):
            v = out[k]
            if tuple(v.stride()) != stride or v.dtype != dtype:  # the graph was compiled for the traced layout
                out[k] = torch.empty_strided(shape, stride, dtype=dtype, device=v.device).copy_(v)
        return out

    def __getattr__(self, name: str) -> Any:  # the compiled graph's own attributes (its plan, its kernels)
        return getattr(self.__dict__["runner"], name)
