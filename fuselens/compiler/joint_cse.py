"""Common subexpressions of a joint graph merged before it is partitioned.

torch's min-cut partitioner first runs `fx_graph_cse`, which imports
`torch._inductor.pattern_matcher` for its mutation regions, and with it most of
Inductor: 116 modules and 0.5 s of the first training compile in a process that
uses fuselens alone (this 2-core machine, a 3-layer MLP's first call 1.5 s -> 1.0 s).
`cse` is the same rule without that import; the partitioner is then called with
its own CSE off (`partition_without_its_cse`).

Two nodes merge when they call the same target on the same (already merged)
arguments, both between the same two mutations, and neither draws random
numbers, allocates uninitialised memory, shares storage with a graph output (eager
returns separate tensors there) or defines an unbacked symbol.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import sympy
import torch
import torch.fx
from torch._functorch.compile_utils import get_aten_target, rand_ops
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten

try:
    from torch._higher_order_ops.auto_functionalize import AutoFunctionalized
except ImportError:  # pragma: no cover - a torch without it has no such nodes either
    AutoFunctionalized = ()

aten = torch.ops.aten

# uninitialised memory: each is a buffer of its own, which a later op may fill in place
# (a mixture-of-experts layer's inverse permutation, runtime/plan.py `_externs_in_place`)
_ALLOCATIONS = {getattr(aten, name) for name in ("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                                                  "new_empty_strided") if hasattr(aten, name)}

# the names of in-place and stateful callables (pattern_matcher's `_mutation_op_re`)
_MUTATING_NAME = re.compile(r"(?<!_)(_$|_[.]|(\b|_)(set|enter|exit|seed)(\b|_))(?!_)")


def _mutates(node: torch.fx.Node) -> bool:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.is_mutable
    if isinstance(target, AutoFunctionalized):
        return False
    if node.op == "call_function" and _MUTATING_NAME.search(getattr(target, "__name__", "")):
        return True
    if node.op == "call_method" and _MUTATING_NAME.search(str(target)):
        return True
    return node.kwargs.get("out") is not None


def storage_of(node: torch.fx.Node) -> Any:
    """The storage of a node's fake value (what values sharing memory have in common), or None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())
    except NotImplementedError:
        return None


def _defines_unbacked(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, sympy.Symbol) and bool(free_unbacked_symbols(val))


def cse(graph: torch.fx.Graph, merged: Optional[list[tuple[str, str]]] = None) -> torch.fx.Graph:
    """A copy of `graph` with its common subexpressions merged (the rule above);
    `merged`, when given, gets (dropped node, the node that computes it) pairs."""
    output = list(graph.nodes)[-1]
    out_storages = {s for s in map(storage_of, output.all_input_nodes) if s is not None}
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    seen: dict[Any, tuple[Any, torch.fx.Node]] = {}
    region = 0
    for n in graph.nodes:
        if _mutates(n):
            region += 1
        target = get_aten_target(n)
        if (n.op in ("placeholder", "output", "get_attr") or target in rand_ops or target in _ALLOCATIONS
                or _defines_unbacked(n) or (out_storages and storage_of(n) in out_storages)):
            env[n] = new.node_copy(n, lambda x: env[x])
            continue
        args, args_spec = _substituted(n.args, env)
        kwargs, kwargs_spec = _substituted(n.kwargs, env)
        # the type with each value: (x, 1.0) and (x, 1) hash and compare alike
        key = (region, n.target, tuple((a, type(a)) for a in args), tuple((a, type(a)) for a in kwargs))
        try:
            hit = seen.get(key)
        except TypeError:  # an unhashable argument: nothing to merge it with
            env[n] = new.node_copy(n, lambda x: env[x])
            continue
        if hit is not None and hit[0] == (args_spec, kwargs_spec):  # specs do not hash
            env[n] = hit[1]
            if merged is not None:
                merged.append((n.name, hit[1].name))
            continue
        env[n] = new.node_copy(n, lambda x: env[x])
        seen[key] = ((args_spec, kwargs_spec), env[n])
    return new


def _substituted(tree: Any, env: dict) -> tuple[tuple, Any]:
    leaves, spec = tree_flatten(tree)
    out = []
    for v in leaves:
        if isinstance(v, torch.fx.Node):
            v = env.get(v, v)
        elif isinstance(v, (torch.SymBool, torch.SymInt, torch.SymFloat)):
            v = v.node
        out.append(v)
    return tuple(out), spec


def partition_without_its_cse(partition: Callable) -> Callable:
    """`partition` (a functorch partitioner) run on the joint graph after its no-op copies
    are removed (joint_noops.py) and `cse`, with functorch's own CSE pass off."""

    def partitioned(joint: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        from torch._functorch import config

        from fuselens.compiler.joint_noops import drop_noop_copies

        dropped = drop_noop_copies(joint.graph)
        if config.cse:
            joint.graph = cse(joint.graph)  # which regenerates the module's code
        elif dropped:
            joint.recompile()
        with config.patch(cse=False):
            return partition(joint, *args, **kwargs)

    return partitioned
