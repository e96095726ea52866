"""A graph compiled around the custom ops whose backward AOTAutograd cannot trace.

A custom op (`torch.library`) whose registered backward reads a tensor's value in
Python (`.tolist()`, `.item()`) cannot be traced into a joint graph: AOTAutograd's
trace raises a data-dependent error inside that backward. Hugging Face transformers'
grouped-matmul fallback for mixture-of-experts layers is one (up to 5.17: its backward
loops over `offs.tolist()`). Dynamo (torch 2.11+) answers any backend's exception with a
graph break before the op, and the break repeats in every enclosing frame: Mixtral's
training step became 12 graphs, with the code of the frames around each break run
eagerly, slower than eager on every backend.

We split the graph instead: the pieces between those ops are compiled as usual
(each its own AOTAutograd graph, as under DDP's bucket splits); each op runs as eager
runs it, between them, its backward in Python through its own autograd node; and
Dynamo keeps one graph. An ErrorEntry (kind "fallback") at the op's line says so.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from fuselens import sink
from fuselens.capture.frames import is_custom_op_backward
from fuselens.compiler.explain import is_torch_or_compiler_file, location_from_stack
from fuselens.events import ErrorEntry


@dataclass(frozen=True)
class UntraceableBackward:
    """Which ops' backward failed to trace, and where in it."""

    ops: frozenset[str]  # qualified names: "transformers::grouped_mm_fallback"
    error: str  # the exception, one line
    where: str  # the innermost frame outside torch: "moe.py:235 in _grouped_mm_fallback_backward"


def untraceable_backward(exc: BaseException) -> Optional[UntraceableBackward]:
    """The custom ops whose registered backward `exc` was raised in, while tracing.

    A torch.library op's backward runs inside the `backward` of the autograd.Function
    that `torch/_library/autograd.py` generates for it; that frame's closure holds the op.
    None when the exception came from anywhere else (then nothing is split)."""
    ops: set[str] = set()
    where = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        code = frame.f_code
        if is_custom_op_backward(code.co_filename, code.co_name):
            op = frame.f_locals.get("op")
            name = _qualified_name(op)
            if name:
                ops.add(name)
        elif ops and not is_torch_or_compiler_file(code.co_filename):
            where = f"{code.co_filename.rsplit('/', 1)[-1]}:{line} in {code.co_name}"
    if not ops:
        return None
    first = (str(exc).splitlines() or [""])[0]
    return UntraceableBackward(frozenset(ops), f"{type(exc).__name__}: {first}"[:200], where)


def _qualified_name(target: Any) -> str:
    """"ns::op" of an OpOverload or OpOverloadPacket; "" for anything else."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    return ""


def can_split(gm: torch.fx.GraphModule, found: UntraceableBackward) -> bool:
    """The graph calls the ops, and is not itself one of DDPOptimizer's buckets (whose
    split keeps its per-bucket metadata on the tracing context, which ours would replace)."""
    ctx = torch._guards.TracingContext.try_get()
    return bool(calls_of(gm, found.ops)) and getattr(ctx, "ddp_optimizer_ctx", None) is None


def calls_of(gm: torch.fx.GraphModule, ops: frozenset[str]) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and _qualified_name(n.target) in ops]


def compile_around(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], found: UntraceableBackward,
                   compile_part: Callable[[torch.fx.GraphModule, list], Callable], compile_id: str) -> Callable:
    """`gm` split at each call of `found.ops`: the parts between compiled by
    `compile_part` (an AOTAutograd compile), the calls run eagerly. Parts are cut in
    graph order, which is a topological order, so each part's inputs come from parts
    before it."""
    from torch._dynamo.backends.distributed import SubmodCompiler, propagate_dynamo_source, propagate_metadata
    from torch._guards import detect_fake_mode
    from torch.fx.passes.split_module import split_module

    calls = calls_of(gm, found.ops)
    part_of: dict[torch.fx.Node, int] = {}
    part = 0
    for n in gm.graph.nodes:
        if n in calls:
            part_of[n] = part + 1
            part += 2
        else:
            part_of[n] = part
    eager_parts = {part_of[n] for n in calls}
    split = split_module(gm, None, lambda n: part_of[n], keep_original_order=True)
    propagate_dynamo_source(gm, split)
    propagate_metadata(gm, split)
    eager_modules = {id(getattr(split, f"submod_{p}")) for p in eager_parts}

    def compile_or_keep(sub: torch.fx.GraphModule, args: list) -> Callable:
        return sub if id(sub) in eager_modules else compile_part(sub, args)

    fake_mode = detect_fake_mode(example_inputs) or torch._subclasses.fake_tensor.FakeTensorMode()
    with torch._dynamo.utils._disable_saved_tensors_hooks_during_tracing():
        SubmodCompiler(split, compile_or_keep, fake_mode).run(*example_inputs)
    split.recompile()
    for op in sorted(found.ops):
        mine = [n for n in calls if _qualified_name(n.target) == op]
        sink.emit(ErrorEntry(
            kind="fallback", compile_id=compile_id,
            location=location_from_stack(mine[0].meta.get("stack_trace") or ""),
            message=(f"{op} runs eagerly between compiled parts of this graph ({len(mine)} "
                     f"call{'s' if len(mine) != 1 else ''}): AOTAutograd cannot trace its backward "
                     f"({found.error}{', at ' + found.where if found.where else ''}); the graph was "
                     f"split around it, {len(eager_parts) + 1} parts, where Dynamo would have broken it"),
            explained=("its registered backward reads a tensor's value in Python; registering that "
                       "loop as a custom op of its own makes the backward traceable and the graph whole"),
        ))
    return split
