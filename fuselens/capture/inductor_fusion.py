"""Inductor's fusion decisions as `FusionDecision` events (worker side).

- fused: every generated kernel that holds more than one op is one decision,
  its nodes from Inductor's provenance (kernel -> post-grad -> Dynamo nodes).
- not fused: Inductor's scheduler says why two scheduler nodes stayed apart
  through `WhyNoFuse`, which logs itself (the object, not a string) to the
  `fusion` artifact logger `torch._inductor.scheduler.__fusion` at DEBUG.
  `FusionLog` is a handler there; while the scheduler runs, `V.graph` still
  knows which post-grad FX nodes each scheduler node came from. The refusals
  wait for their graph's output code (InductorKernels) and become decisions
  once the kernels are known; pairs that a later round fused after all
  (Inductor logs `fusing A with B`) are dropped.

Versions: 2.11 to 2.13 `WhyNoFuse` keeps `name1`/`name2`; older ones kept the
nodes (`node1`/`node2`); both are read. Scheduler node names are operation
names (`op3`, fused `op3_op4`) since 2.5, buffer names (`buf3`) before.
Neither the fusion artifact nor WhyNoFuse carries anything into the
structured trace (only the `fusion_failure_due_to_indexing_mismatch` metric
table, off by default), so the logger is the source.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from fuselens.capture import frames as fr
from fuselens.capture.torchlog import TorchLogReader
from fuselens.events import FusionDecision, Kernel, SourceLocation

FUSION_LOGGER = "torch._inductor.scheduler.__fusion"

# Inductor's reason (the format string it passes to WhyNoFuse) -> (rule, what
# it means for the user, the config option that changes it). The rule names
# Inductor's check. Reasons not listed keep Inductor's own words.
_RULES: dict[str, tuple[str, str, str]] = {
    "exceeds max fusion": (
        "max_fusion_size",
        "fusing them would put more ops into one kernel than Inductor allows",
        "torch._inductor.config.max_fusion_size",
    ),
    "no shared data": (
        "score_fusion_memory",
        "they touch the same buffer but not the same elements in the same order, "
        "so one kernel would save no memory traffic",
        "",
    ),
    "no shared data due to indexing mismatch": (
        "score_fusion_memory",
        "they read the same buffer with different indexing, so one kernel would save no memory traffic",
        "",
    ),
    "Fusion will increase peak memory": (
        "peak_memory",
        "one kernel would keep more buffers alive at once and raise peak memory",
        "",
    ),
    "fusion_prevent_too_many_reads_and_writes": (
        "max_fusion_unique_io_buffers",
        "one kernel would read and write too many distinct buffers",
        "torch._inductor.config.max_fusion_unique_io_buffers",
    ),
    "score_fusion_memory_threshold": (
        "score_fusion_memory_threshold",
        "they share too little data for fusing side by side to pay off",
        "torch._inductor.config.score_fusion_memory_threshold",
    ),
    "Nodes are too far away. Fusing them may increase peak memory.": (
        "long_distance",
        "they run far apart in the program; fusing them would keep buffers alive in between",
        "",
    ),
    "device mismatch (%s vs %s)": ("device_mismatch", "they run on different devices", ""),
    "node1 must go before node2": (
        "dependency_order",
        "the second runs before the first in the schedule; fusing them would break the order",
        "",
    ),
    "memory deps did not match": (
        "memory_deps",
        "the consumer reads the producer's buffer at other positions than it writes them",
        "",
    ),
    "intermediate nodes between node1 & node2": (
        "intermediate_nodes",
        "other work between them needs the first result before the second can run",
        "",
    ),
    "node2 is extern or nop": (
        "extern",
        "the second is a library call (or does nothing) and cannot join a generated kernel",
        "",
    ),
    "grouped node must not be fused with other nodes": ("grouped", "it belongs to a fixed group of kernels", ""),
    "fusion for buffer explicit disabled": ("explicitly_disabled", "fusion was turned off for this buffer", ""),
    "register spilling of the fused kernel": (
        "register_spilling",
        "the fused kernel would spill registers",
        "",
    ),
}


@dataclass
class Refusal:
    """One `cannot fuse A with B: reason`, resolved to post-grad FX nodes."""

    names: tuple[str, str]  # Inductor's scheduler node names
    sides: tuple[list[str], list[str]]  # post-grad FX node names of each side
    reason: str  # Inductor's format string
    text: str  # Inductor's message, formatted
    locations: list[SourceLocation] = field(default_factory=list)


class FusionLog(TorchLogReader):
    """Handler on Inductor's fusion artifact logger; refusals per compile id."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[str, list[Refusal]] = {}
        self._merges: dict[str, list[tuple[str, str]]] = {}  # "fusing A with B", per compile id
        self._lock = threading.Lock()

    def reset_run(self) -> None:
        """Forget the last run's refusals and merges, and listen again."""
        with self._lock:
            self._pending.clear()
            self._merges.clear()
        logger = logging.getLogger(FUSION_LOGGER)
        # torch._logging.set_logs() resets artifact levels: enable per run.
        # propagate stays as torch set it (True only if the user asked for
        # fusion logs, who then still sees them on stderr).
        if logger.level == logging.NOTSET or logger.level > logging.DEBUG:
            logger.setLevel(logging.DEBUG)

    def take(self, compile_id: str) -> list[Refusal]:
        """The refusals logged for `compile_id` so far (they belong to the
        graph whose output code comes next), without the pairs the scheduler
        fused in a later round after all."""
        with self._lock:
            # A backward compiled lazily may run outside any compile context
            # (id ""): it belongs to the graph whose code comes next.
            refusals = self._pending.pop(compile_id, []) + self._pending.pop("", [])
            merges = self._merges.pop(compile_id, []) + self._merges.pop("", [])
        group: dict[str, str] = {}

        def find(name: str) -> str:
            while group.get(name, name) != name:
                name = group[name]
            return name

        for first, second in merges:  # "fusing op0 with op1" -> one group
            parts = [p for n in (first, second) for p in n.split("_")]
            root = find(parts[0])
            for part in parts[1:]:
                other = find(part)
                if other != root:
                    group[other] = root
        out = []
        for r in refusals:
            roots = [{find(p) for p in name.split("_")} for name in r.names]
            if not roots[0] & roots[1]:
                out.append(r)
        return out

    def read(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if msg == "fusing %s with %s" and isinstance(record.args, tuple) and len(record.args) == 2:
            cid = _current_compile_id()
            with self._lock:
                self._merges.setdefault(cid, []).append((str(record.args[0]), str(record.args[1])))
            return
        if not hasattr(msg, "reason"):
            return  # the other fusion messages (candidates, scores)
        refusal = _refusal(msg)
        if refusal is None:
            return
        cid = _current_compile_id()
        with self._lock:
            self._pending.setdefault(cid, []).append(refusal)


def install() -> FusionLog:
    """Attach a FusionLog to Inductor's fusion logger."""
    handler = FusionLog()
    logging.getLogger(FUSION_LOGGER).addHandler(handler)
    return handler


def _current_compile_id() -> str:
    try:
        import torch

        cid = torch._guards.CompileContext.current_compile_id()
    except (ImportError, AttributeError):
        return ""
    if cid is None or getattr(cid, "frame_id", None) is None:
        return ""
    return f"{cid.frame_id}/{cid.frame_compile_id}"


def _node_name(msg: Any, which: int) -> str:
    name = getattr(msg, f"name{which}", None)
    if name is None:  # before 2.6: the nodes themselves
        node = getattr(msg, f"node{which}", None)
        name = node.get_name() if node is not None else ""
    return str(name)


def _refusal(msg: Any) -> Optional[Refusal]:
    names = (_node_name(msg, 1), _node_name(msg, 2))
    reason = str(msg.reason)
    args = tuple(getattr(msg, "args", ()) or ())
    try:
        text = reason % args if args else reason
    except (TypeError, ValueError):
        text = reason
    sides: list[list[str]] = []
    locations: list[SourceLocation] = []
    for name in names:
        origins = _origins(name)
        sides.append([n.name for n in origins])
        for node in origins:
            loc = fr.innermost_user_in(node.meta.get("stack_trace"))
            if loc is not None and all((loc.file, loc.line) != (o.file, o.line) for o in locations):
                locations.append(loc)
    return Refusal(names, (sides[0], sides[1]), reason, text, locations)


def _origins(name: str) -> list[Any]:
    """Post-grad FX nodes behind a scheduler node name (fused names join
    their parts with `_`)."""
    try:
        from torch._inductor.virtualized import V

        graph = V.graph
    except Exception:
        return []
    ops = getattr(graph, "name_to_op", {}) or {}
    buffers = getattr(graph, "name_to_buffer", {}) or {}
    out: list[Any] = []
    for part in [name, *name.split("_")]:
        op = ops.get(part) or buffers.get(part)
        if op is None:
            continue
        origins = op.get_origins() if hasattr(op, "get_origins") else getattr(op, "origins", ())
        for node in origins or ():
            if node not in out:
                out.append(node)
        if part == name:
            break  # the whole name was one node
    return out


# ---------------------------------------------------------------- decisions
def fusion_decisions(seg: Any, kernels: list[Kernel], graph_id: str) -> list[FusionDecision]:
    """Fused kernels and not-fused pairs of one Inductor graph.

    `seg` is the graph's `_Segment` (post-grad targets in graph order,
    kernel -> post-grad provenance, post -> Dynamo nodes, refusals)."""
    kernel_of_post, posts_of = _provenance(seg)
    return _fused(kernels, posts_of, graph_id) + _not_fused(seg, kernel_of_post, graph_id)


def _provenance(seg: Any) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Post-grad node -> the (first) kernel that computes it, and kernel ->
    its post-grad nodes, from the `kernel:line` keys of the code provenance."""
    kernel_of_post: dict[str, str] = {}
    posts_of: dict[str, list[str]] = {}
    for key, posts in seg.code_to_post.items():
        posts_of.setdefault(key.rsplit(":", 1)[0], []).extend(posts)
        for post in posts:
            kernel_of_post.setdefault(post, key.rsplit(":", 1)[0])
    return kernel_of_post, posts_of


def _fused(kernels: list[Kernel], posts_of: dict[str, list[str]], graph_id: str) -> list[FusionDecision]:
    """One "fused" decision per generated kernel of two or more ops."""
    out: list[FusionDecision] = []
    for kernel in kernels:
        if kernel.kind == "extern" or len(kernel.ops) < 2:
            continue
        ops = ", ".join(_short(o) for o in kernel.ops)
        out.append(
            FusionDecision(
                decision="fused",
                # Dynamo nodes; post-grad ones where provenance has none
                nodes=list(kernel.nodes) or list(dict.fromkeys(posts_of.get(kernel.name, []))),
                reason=f"Inductor generated one {kernel.kind} kernel for {len(kernel.ops)} ops ({ops})",
                kernel=kernel.name,
                graph_id=graph_id,
                rule="inductor:fused",
                locations=list(kernel.source_lines),
            )
        )
    return out


def _not_fused(seg: Any, kernel_of_post: dict[str, str], graph_id: str) -> list[FusionDecision]:
    """One "not_fused" decision per distinct pair the scheduler refused."""
    order = {name: i for i, name in enumerate(seg.post_targets)}
    out: list[FusionDecision] = []
    seen: set[tuple] = set()
    for refusal in seg.refusals:
        decision = _refusal_decision(refusal, seg, order, kernel_of_post, graph_id)
        if decision is None:
            continue
        key = (*decision.nodes, decision.rule)
        if key in seen:
            continue  # the scheduler retries pairs in several rounds
        seen.add(key)
        out.append(decision)
    return out


def _refusal_decision(
    refusal: Refusal, seg: Any, order: dict[str, int], kernel_of_post: dict[str, str], graph_id: str
) -> Optional[FusionDecision]:
    """The refusal as a decision between the two Dynamo nodes where its sides
    meet; None when the sides cannot be told apart."""
    first, second = refusal.sides
    # A node can be an origin of both sides (Inductor inlines the tail of
    # a reduction into its consumer): name each side by what is its own.
    second = [n for n in second if n not in first] or second
    first = [n for n in first if n not in second] or first
    if not first or not second:
        return None
    k1 = {kernel_of_post.get(n) for n in first} - {None}
    k2 = {kernel_of_post.get(n) for n in second} - {None}
    # The producer side is named by its last node, the consumer side by
    # its first: the pair where the kernels meet.
    a = _pre(max(first, key=lambda n: order.get(n, -1)), seg, last=True)
    b = _pre(min(second, key=lambda n: order.get(n, len(order))), seg, last=False)
    if a == b:
        return None
    rule, words, option = _RULES.get(refusal.reason, ("", "", ""))
    if k1 and k1 == k2 and len(k1) == 1:
        # Inductor's C++ backend writes consecutive unfused nodes into one
        # function, one loop nest after the other: apart all the same.
        reason = f"{a} and {b} stayed in separate loops (one after the other in {_kernel_label(k1)}): "
    else:
        reason = f"{a} ({_kernel_label(k1)}) and {b} ({_kernel_label(k2)}) stayed in separate kernels: "
    reason += words or refusal.text
    if words:
        reason += f" (Inductor: {refusal.text})"
    return FusionDecision(
        decision="not_fused",
        nodes=[a, b],
        reason=reason,
        kernel=None,
        graph_id=graph_id,
        rule=f"inductor:{rule or _slug(refusal.reason)}",
        locations=list(refusal.locations),
        option=option,
    )


def _pre(post: str, seg: Any, last: bool) -> str:
    """A post-grad node as the Dynamo node it came from (itself if unknown)."""
    pre = seg.post_to_pre.get(post) or []
    if not pre:
        return post
    return pre[-1] if last else pre[0]


def _kernel_label(kernels: set) -> str:
    return ", ".join(sorted(kernels)) if kernels else "no kernel"


def _short(target: str) -> str:
    parts = target.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] in ("aten", "prims") else target


def _slug(reason: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", reason.lower()).strip("_")[:40] or "unknown"
