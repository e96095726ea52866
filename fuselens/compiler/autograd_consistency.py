"""A forward and its backward must compute an op the same way.

AOTAutograd records an op's backward at the autograd level, then runs the op's
decomposition below it. When the forward op `F` is decomposed but its backward
`F_backward` is not, the backward kernel reads tensors that `F`'s decomposition
produced, and it trusts them to be what `F` itself returns. They need not be:
torch's decomposition of `_scaled_dot_product_flash_attention_for_cpu` returns
the attention weights where the real op returns the logsumexp, and the flash
backward fed with them gives gradients 30-90x off.

The rule is checked on the joint graph, before partitioning: a backward op that
stays whole (one ATen call) may not read a value made inside its forward op's
decomposition. `node.meta["original_aten"]` says which op a node's
decomposition came from. The backend answers a mismatch by keeping the forward
op whole as well and tracing again, and says so in a finding.

The same walk finds ops whose forward is decomposed (and so fused) while their
backward runs whole in ATen: not wrong, but a one-direction fallback a user
should see.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch
import torch.fx

from fuselens.events import SourceLocation

BACKWARD_SUFFIXES = ("_backward_data", "_backward")

# Ops that pass a value through unchanged: a backward that reads `alias(x)`
# reads `x` (AOTAutograd saves forward outputs through `detach`, traced as `alias`).
_PASS_THROUGH = {"alias", "detach", "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand",
                 "clone", "contiguous"}


# Forward ops whose decomposition (fuselens' own, entry.py) returns the op's very outputs,
# which their backward reads: max_pool2d_with_indices becomes the pool with int8 window
# places and those places turned back into its indices. No pairing to check or report.
OUTPUT_PRESERVING = {"max_pool2d_with_indices"}


def packet_name(target: Any) -> str:
    """`aten._softmax.default` -> `_softmax`; "" for non-ATen targets."""
    packet = getattr(target, "_overloadpacket", None)
    return getattr(packet, "__name__", "") if packet is not None else ""


def forward_name(backward: str) -> Optional[str]:
    """The forward op a backward op belongs to, by ATen's naming
    (`X_backward`, `X_backward_data`); None when `backward` is not one."""
    for suffix in BACKWARD_SUFFIXES:
        if backward.endswith(suffix) and len(backward) > len(suffix):
            return backward[: -len(suffix)]
    return None


@dataclass(frozen=True)
class OpPairing:
    """How one op's forward and backward were traced in a joint graph."""

    forward_op: str  # "aten._scaled_dot_product_flash_attention_for_cpu.default"
    backward_op: str
    reads_decomposed_outputs: bool  # the whole backward reads values of the forward's decomposition
    location: Optional[SourceLocation]


class ForwardBackwardMismatch(Exception):
    """A joint graph whose whole backward op reads its decomposed forward's values."""

    def __init__(self, pairings: list[OpPairing]):
        self.pairings = pairings
        ops = ", ".join(sorted({p.forward_op for p in pairings}))
        super().__init__(f"backward reads values of a decomposed forward: {ops}")


def _decomposed_from(node: torch.fx.Node) -> Any:
    """The op whose decomposition created `node`, or None when `node` is that op
    itself (or no ATen op at all)."""
    if node.target is operator.getitem:  # an output of a multi-output op is that op's
        return _decomposed_from(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
    origin = node.meta.get("original_aten")
    # compared by name: the recorded overload is not always the very object of node.target
    if origin is None or str(origin) == str(node.target):
        return None
    return origin


def _sources(node: torch.fx.Node) -> Iterable[torch.fx.Node]:
    """The values a node reads, seen through pass-through ops."""
    seen: set[torch.fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        yield n
        if n.op == "call_function" and packet_name(n.target) in _PASS_THROUGH:
            stack.extend(n.all_input_nodes)


def pairings(joint: torch.fx.GraphModule, location_of: Callable[[str], Optional[SourceLocation]]) -> list[OpPairing]:
    """Every whole backward op of `joint` whose forward op was decomposed."""
    decomposed = {packet_name(o): o for o in (_decomposed_from(n) for n in joint.graph.nodes) if o is not None}
    found: list[OpPairing] = []
    for node in joint.graph.nodes:
        if node.op != "call_function" or _decomposed_from(node) is not None:
            continue
        fwd = forward_name(packet_name(node.target))
        if fwd is None or fwd not in decomposed or fwd in OUTPUT_PRESERVING:
            continue
        reads = any(packet_name(_decomposed_from(s)) == fwd for s in _sources(node) if _decomposed_from(s) is not None)
        found.append(OpPairing(forward_op=str(decomposed[fwd]), backward_op=str(node.target),
                               reads_decomposed_outputs=reads, location=location_of(node.meta.get("stack_trace") or "")))
    return found


def checked_partition(partition: Callable, location_of: Callable[[str], Optional[SourceLocation]],
                      seen: list[OpPairing]) -> Callable:
    """`partition` that first checks the joint graph: raises ForwardBackwardMismatch
    where a backward reads decomposed forward values, and appends every pairing to
    `seen` (the one-direction fallbacks among them are reported by the caller)."""

    def partition_checked(joint: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        found = pairings(joint, location_of)
        bad = [p for p in found if p.reads_decomposed_outputs]
        if bad:
            raise ForwardBackwardMismatch(bad)
        seen.extend(found)
        return partition(joint, *args, **kwargs)

    return partition_checked
