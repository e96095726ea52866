"""What keeps a compiled graph from being replayed as a CUDA graph (option `cuda_graphs`).

A replay repeats the device work recorded at capture and nothing else. A value read on
the host (`.item()`, a size that depends on the data), a CPU tensor's value and work done
on the CPU are those of the capture, on every replay: a compiled Adam whose step counter
is a CPU tensor would apply the first step's bias correction forever. Such a graph runs
with plain launches instead, and the finding says why and at which line, as Inductor
says "skipping cudagraphs due to ...".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

aten = torch.ops.aten

# ops that read a device value on the host, or size their output by the data (a capture
# cannot wait for the device; a replay would keep the capture's answer)
_HOST_READS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select, aten.is_nonzero, aten.equal,
               aten._unique2, aten.unique_consecutive, aten.unique_dim, aten.bincount, aten._assert_async}


@dataclass(frozen=True)
class CaptureBlocker:
    """The first thing found that a replay could not repeat, in a user's words."""

    reason: str
    stack_trace: str = ""  # the op's, from the FX node; "" for a graph input


def capture_blocker(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                    device_type: str = "cuda") -> Optional[CaptureBlocker]:
    """Why the graph of `gm` cannot be replayed as a CUDA graph on a `device_type`
    device, or None when it can."""
    for i, a in enumerate(example_inputs):
        if isinstance(a, torch.Tensor) and a.device.type != device_type:
            return CaptureBlocker(f"input {i} of the graph ({_describe(a)}) is a {a.device.type} tensor: a replay "
                                  "would use its value at capture, not the one of the call")
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        stack = node.meta.get("stack_trace") or ""
        name = _op_name(node)
        if getattr(node.target, "overloadpacket", None) in _HOST_READS:
            return CaptureBlocker(f"{name} reads a value of the device on the host (or sizes its output by the "
                                  "data): a replay would keep the capture's", stack)
        val = node.meta.get("val")
        if _data_dependent_size(val):
            return CaptureBlocker(f"{name} makes a tensor whose size depends on the data: a replay would keep the "
                                  "capture's size", stack)
        for t in _tensors(val):
            if t.device.type != device_type and t.dim() > 0:  # a 0-d literal is a constant: replayed alike
                return CaptureBlocker(f"{name} computes on the {t.device.type}: a replay repeats only the device's "
                                      "work, so its result would be the capture's", stack)
    return None


def _op_name(node: torch.fx.Node) -> str:
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    return f"aten.{packet.__name__}" if packet is not None else getattr(target, "__name__", str(target))


def _describe(t: torch.Tensor) -> str:
    return f"{list(t.shape)}, {str(t.dtype).replace('torch.', '')}"


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)):
        return [t for v in val for t in _tensors(v)]
    return []


def _data_dependent_size(val: Any) -> bool:
    try:
        return bool(free_unbacked_symbols(val))
    except Exception:  # noqa: BLE001 - a value it cannot walk is not a data-dependent size
        return False
