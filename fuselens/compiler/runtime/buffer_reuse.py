"""Which dead buffer each allocation of a static GPU graph takes over, decided once.

On the GPU a training step is host-bound, and every fresh tensor costs the host time:
`_empty_strided_cuda` 2.3 us on the H200, and a matmul that allocates its own result
3 us more than one given `out=` (15.8 against 18.9 us). Inductor's wrapper hands a dead
buffer of the same byte size to the next allocation (`buf5 = buf3; del buf3  # reuse`);
ours allocated every buffer: T5's training step made 1,118 tensors to Inductor's 528, and
its host time was 29.1 ms to Inductor's 25.7 (H200, thirtieth session).

A buffer kept for a later allocation stays allocated from its death to that allocation,
where the caching allocator could have given its block to something in between. So a
hold is taken only where the graph's live bytes, with every hold taken before it, stay at
or below the graph's own peak without any: reusing never raises the peak the plan sees.
A library call may allocate scratch memory while it runs, which the plan cannot see:
cuDNN's convolution workspace, an attention backward's temporaries (ViT-B/16's cuDNN
attention backward allocated 17 MB beyond its outputs). Holds across such calls, once
allowed wherever the live bytes stayed under the peak, raised the real step peaks of ViT,
MobileNetV3 and EfficientNet training 0.5-0.9% above Inductor's (H200, thirty-third
session), each at such a call; refused everywhere, they left DenseNet-121's training step
(a convolution every fourth step) with 2,515 fresh tensors, 10.7 ms of its 58 ms on the
H200's host (fortieth session). So a hold spans such a call only where the live bytes
there, the hold and the graph's inputs included, stay an eighth of the graph's peak below
it: only a call whose scratch exceeds that eighth of the memory can make the hold count.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import torch

from fuselens.compiler import ir
from fuselens.compiler.runtime.interpreter import ExternCall, Free, KernelCall

# Holds longer than this many plan steps are not looked for: the check is linear in the
# hold's length, and a buffer dead that long has usually been outlived by its size's uses.
WINDOW = 256

# A hold spans a library call that may allocate scratch only where the live bytes there stay
# 1/SCRATCH_MARGIN of the graph's peak (its inputs' bytes included) below that peak.
SCRATCH_MARGIN = 8


@dataclass
class StorageFacts:
    """What the planner knows of a static graph's buffers (bytes by owning name)."""

    nbytes: dict[str, int]  # every buffer owning its storage whose size is static (inputs too)
    dtype: dict[str, torch.dtype]
    poolable: set[str]  # owners whose storage may be handed on once they die
    takers: set[str]  # allocations that may take a dead buffer's storage
    took: dict[str, str] = field(default_factory=dict)  # output -> the dying input whose storage it took
    layout: dict[str, tuple] = field(default_factory=dict)  # buffer -> (size, stride), those in nbytes
    input_bytes: int = 0  # the graph's inputs, alive at its start (a backward's saved activations)


def reuse_map(plan: list[Any], facts: StorageFacts) -> dict[str, str]:
    """taker -> the dead buffer whose storage it takes (same dtype and byte size)."""
    owner_bytes = dict(facts.nbytes)
    for out, src in facts.took.items():  # an output written over a dying input lives in its storage
        if src in owner_bytes:
            owner_bytes[out] = owner_bytes[src]
    moved = set(facts.took.values())  # their storage lives on in the output that took it
    curve = _live_curve(plan, owner_bytes, facts.took, moved)
    peak = max([0, *curve])
    at_scratch = [i for i, step in enumerate(plan) if _may_allocate_scratch(step)]
    # the most a scratch call may see live (the curve is relative to the inputs' bytes)
    below_scratch = peak - (facts.input_bytes + peak) // SCRATCH_MARGIN
    total = list(curve)  # live bytes after each step, with the holds taken so far
    dead: dict[tuple, list[tuple[str, int]]] = {}  # (dtype, bytes) -> (buffer, where it died)
    taken: dict[str, str] = {}
    for t, step in enumerate(plan):
        if isinstance(step, Free):
            for n in step.names:
                if n in facts.poolable and n in owner_bytes and n not in moved:
                    dead.setdefault((facts.dtype[n], owner_bytes[n]), []).append((n, t))
            continue
        for name in _allocated(step):
            if name not in facts.takers or name not in owner_bytes:
                continue
            size = owner_bytes[name]
            cands = dead.get((facts.dtype[name], size)) if size else None
            if not cands:
                continue
            for k in range(len(cands) - 1, -1, -1):  # the latest death first: the shortest hold
                buf, died = cands[k]
                if t - died > WINDOW or not _under(total, at_scratch, died, t, below_scratch - size):
                    break  # earlier deaths span the same steps and more
                if max(total[died:t]) + size <= peak:
                    for i in range(died, t):
                        total[i] += size
                    taken[name] = buf
                    del cands[k]
                    break
    return taken


def _under(total: list[int], at_scratch: list[int], start: int, stop: int, limit: int) -> bool:
    """Whether the live bytes at every scratch-allocating call in [start, stop) are at most `limit`."""
    lo = bisect.bisect_left(at_scratch, start)
    hi = bisect.bisect_left(at_scratch, stop)
    return all(total[at_scratch[i]] <= limit for i in range(lo, hi))


# Library calls that allocate nothing beyond their results while they run: cuBLAS keeps
# its workspace per handle (allocated once), and a copy needs none.
_NO_SCRATCH = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
               torch.ops.aten.baddbmm.default, torch.ops.aten.copy_.default}


def _may_allocate_scratch(step: Any) -> bool:
    """Whether `step` may allocate memory the plan does not see while it runs: a library
    call other than a matmul, a copy or a view."""
    return (isinstance(step, ExternCall) and step.reinterpret is None and step.target not in _NO_SCRATCH
            and not ir.returns_alias(step))


def _allocated(step: Any) -> list[str]:
    if isinstance(step, KernelCall):
        return [name for name, *_ in step.alloc if name not in step.reuse]
    if isinstance(step, ExternCall) and isinstance(step.outputs, str):
        return [step.outputs]
    return []


def _live_curve(plan: list[Any], owner_bytes: dict[str, int], took: dict[str, str], moved: set[str]) -> list[int]:
    """Bytes allocated by the graph and alive after each step, relative to its start
    (inputs it releases count down when they die). A buffer in `took` makes no bytes of
    its own; one in `moved` frees none."""
    live = 0
    curve: list[int] = []
    for step in plan:
        if isinstance(step, KernelCall):
            live += sum(owner_bytes.get(name, 0) for name, *_ in step.alloc if name not in step.reuse)
        elif isinstance(step, ExternCall):
            outs = step.outputs if isinstance(step.outputs, list) else [step.outputs]
            live += sum(owner_bytes.get(o, 0) for o in outs if o is not None and o not in took)
        elif isinstance(step, Free):
            live -= sum(owner_bytes.get(n, 0) for n in step.names if n not in moved)
        curve.append(live)
    return curve

