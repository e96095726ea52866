"""Events for `fuselens report`: the compiled graph, its kernels, every fusion
decision and the fallbacks, built from the scheduler's own records.

Nothing here re-runs a fusion rule: a pair of kernels apart is explained by the
`Decision` the scheduler recorded when it tried that pair (`Schedule.decisions`),
or, where one side is a library call or an op that is not lowered, by that
unit's kind."""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import torch
import torch.fx

from fuselens.compiler import library_epilogues  # noqa: F401  (registers fuselens::conv2d_bias_relu)
from fuselens.compiler.ir import ComputeNode, ExternNode, GraphIR, op_name
from fuselens.compiler.random_ops import SEEDS
from fuselens.compiler.kernel_group import label
from fuselens.compiler.scheduler import Decision, Schedule
from fuselens.events import (
    CompiledGraph,
    ErrorEntry,
    FusionDecision,
    GraphNode,
    Kernel,
    SourceLocation,
)

_ADDMM_ACT = torch.ops.aten._addmm_activation.default
_CONV_RELU = torch.ops.fuselens.conv2d_bias_relu.default
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


# torch's own files, by where this torch was imported from or an installed torch's package
# path; never by the text "/torch/" alone, which held the GPU machine's whole environment
# (/opt/torch/.venv) and so dropped every library frame there
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_INSTALLED_TORCH = re.compile(r"[/\\](?:site|dist)-packages[/\\]torch[/\\]")


def is_torch_or_compiler_file(file: str) -> bool:
    """A frame of torch or of our compiler, which no finding points at. By text (no
    filesystem call): it runs for every node of every graph."""
    return file.startswith(_TORCH_DIR) or bool(_INSTALLED_TORCH.search(file)) or "fuselens/compiler" in file


def location_from_stack(stack: str) -> Optional[SourceLocation]:
    """The innermost user frame of a node's `stack_trace`."""
    if not stack:
        return None
    frames = _FRAME.findall(stack)
    for file, line, fn, code in reversed(frames):
        if is_torch_or_compiler_file(file):
            continue
        return SourceLocation(file=file, line=int(line), function=fn, code=code.strip())
    return None


def _shape(node: torch.fx.Node) -> str:
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        return f"[{', '.join(str(s) for s in v.shape)}] {str(v.dtype).replace('torch.', '')}"
    return ""


def extern_kernel_names(sched: Schedule) -> dict[str, str]:
    out = {}
    for i, u in enumerate(x for x in sched.units if isinstance(x, ExternNode)):
        out[u.name] = f"extern_{op_name(u.fx_node.target).split('.')[1] if '.' in op_name(u.fx_node.target) else u.name}_{i}"
    return out


def build_events(
    gm: torch.fx.GraphModule,
    graph: GraphIR,
    sched: Schedule,
    kernels: dict,
    graph_id: str,
    compile_id: str,
    stage: str,
    function: str,
    location: SourceLocation,
) -> list[Any]:
    events: list[Any] = []
    kernel_of: dict[str, str] = {}
    for grp in sched.groups:
        for f in grp.fx_nodes():
            kernel_of[f] = grp.name
    ext_names = extern_kernel_names(sched)
    kernel_of.update(ext_names)
    nodes = []
    ops = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            ops.append(op_name(n.target))
        nodes.append(GraphNode(
            name=n.name, op=n.op, target=op_name(n.target) if n.op == "call_function" else str(n.target),
            inputs=[a.name for a in n.all_input_nodes], location=location_from_stack(n.meta.get("stack_trace") or ""),
            kernel=kernel_of.get(n.name), shape=_shape(n)))
    events.append(CompiledGraph(compile_id=compile_id, function=function, location=location, backend="fuselens",
                                stage=stage, ops=ops, nodes=nodes, graph_id=graph_id))
    # kernels
    for grp in sched.groups:
        ks = kernels[grp.name]
        locs = _locations(grp.nodes)
        # kind/language/device come from the generator (cpp, or triton/python for the Triton target)
        events.append(Kernel(name=grp.name, kind=getattr(ks, "kind", "cpp"), graph_id=graph_id,
                             ops=[o for n in grp.nodes for o in n.aten_ops], nodes=grp.fx_nodes(), source_lines=locs,
                             source=ks.source, language=ks.language, bytes_accessed=ks.bytes_accessed,
                             device=getattr(ks, "device", "cpu")))
    for e in (u for u in sched.units if isinstance(u, ExternNode)):
        node = e.fx_node
        call = f"{op_name(node.target)}({', '.join(str(a) for a in node.args)})"
        loc = location_from_stack(e.stack_trace)
        events.append(Kernel(name=ext_names[e.name], kind="extern", graph_id=graph_id, ops=[op_name(node.target)],
                             nodes=[e.name], source_lines=[loc] if loc else [], source=call, language=""))
    events.extend(fusion_decisions(graph, sched, graph_id, ext_names))
    # fallbacks, one entry per op kind
    seen = set()
    for e in (u for u in sched.units if isinstance(u, ExternNode) and u.kind == "fallback"):
        key = (op_name(e.fx_node.target), e.reason)
        if key in seen:
            continue
        seen.add(key)
        events.append(ErrorEntry(kind="fallback", message=f"{key[0]} runs in ATen ({e.reason}) in graph {graph_id}",
                                 location=location_from_stack(e.stack_trace), compile_id=compile_id))
    return events


def _locations(nodes: list[ComputeNode]) -> list[SourceLocation]:
    out: list[SourceLocation] = []
    for n in nodes:
        loc = location_from_stack(n.stack_trace)
        if loc and not any(l.file == loc.file and l.line == loc.line for l in out):
            out.append(loc)
    return out


def fusion_decisions(graph: GraphIR, sched: Schedule, graph_id: str,
                     ext_names: dict[str, str]) -> list[FusionDecision]:
    """One "fused" event per multi-node kernel and per library epilogue, and one
    "not_fused" event per pair of FX nodes joined by a data edge across kernels."""
    out: list[FusionDecision] = []
    for grp in sched.groups:
        fx = grp.fx_nodes()
        if len(grp.nodes) > 1:
            out.append(FusionDecision(decision="fused", nodes=fx, kernel=grp.name, graph_id=graph_id,
                                      reason="; ".join(grp.reasons), rule="fused", locations=_locations(grp.nodes)))
    for e in (u for u in sched.units if isinstance(u, ExternNode)):
        why = _library_epilogue(e.fx_node)
        if why:
            out.append(FusionDecision(
                decision="fused", nodes=[e.name], kernel=ext_names.get(e.name), graph_id=graph_id,
                rule="extern-epilogue", option="extern_epilogue_fusion", reason=why,
                locations=[loc for loc in [location_from_stack(e.stack_trace)] if loc]))
    decided = sched.last_decisions()
    seen: set[tuple[str, str]] = set()
    steps = {s.name: s for s in graph.steps}
    for s in graph.steps:
        for o in getattr(s, "outputs", None) or []:
            steps[o] = s
    for s in graph.steps:
        for r in sorted(s.reads):
            p = steps.get(r)
            if p is None or (isinstance(p, ExternNode) and p.fx_node.target is SEEDS):
                continue  # a table of seeds each random draw reads one of: nothing to fuse
            pg, cg = sched.group_of.get(p.name), sched.group_of.get(s.name)
            if pg is not None and pg is cg:
                continue
            pair = (_fx(p), _fx(s))
            if pair in seen or pair[0] == pair[1]:
                continue
            seen.add(pair)
            rule, reason, option = _why_apart(p, s, decided.get((p.name, s.name)), ext_names)
            out.append(FusionDecision(decision="not_fused", nodes=list(pair), reason=reason, graph_id=graph_id,
                                      rule=rule, option=option, kernel=None))
    return out


def _library_epilogue(node: torch.fx.Node) -> str:
    """Why a library call carries pointwise work (library_epilogues.py), or ""."""
    if node.target is _ADDMM_ACT:
        act = "GELU (tanh)" if node.kwargs.get("use_gelu", False) else "ReLU"
        return (f"linear + bias + {act} in one library call: cuBLASLt applies them to the matmul's accumulator "
                "before its store (torch._addmm_activation), so the output is written once and never re-read")
    if node.target is _CONV_RELU:
        add = " + the residual add" if len(node.args) > 3 and node.args[3] is not None else ""
        return (f"convolution + batch norm + ReLU{add} in one cuDNN call: the inference batch norm is folded "
                "into the convolution's weight and bias (a kernel over the weights), and cuDNN applies bias, "
                "add and ReLU in its epilogue, so the activation is written once and never re-read")
    return ""


def _fx(s: Any) -> str:
    return s.fx_nodes[0] if isinstance(s, ComputeNode) else s.name


def _why_apart(p: Any, c: Any, decision: Optional[Decision], ext_names: dict[str, str]) -> tuple[str, str, str]:
    """(rule, reason, option) for producer `p` and consumer `c` in different units."""
    for s in (c, p):
        if isinstance(s, ExternNode):
            if s.kind == "fallback":
                return "fallback", f"{label(s)} is not lowered ({s.reason}); it runs in ATen between kernels", "lower"
            return ("extern", f"{label(s)} is a library call ({ext_names.get(s.name, s.name)}); fuselens "
                    "generates no matmul/convolution kernels to fuse pointwise work into (on the GPU, in inference, "
                    "ReLU/tanh-GELU after a Linear and batch norm+ReLU after a conv2d run in the library's epilogue)",
                    "")
    if decision is None or decision.verdict != "not_fused":
        # Two kernels apart with no refusal on record would be a scheduler bug (every
        # compute edge is tried when its consumer is scheduled); say so, don't guess.
        return "unknown", "not fused (the scheduler recorded no decision for this pair)", ""
    return decision.rule, decision.reason, decision.option
