"""Whether a new CUDA-graph pool reserves one segment before its first warm-up, and how much.

The caching allocator serves a request no free block fits with a new segment of that
request's size, and blocks of different segments never merge. A training forward's
warm-up keeps its saved activations to its end and frees its temporaries between them,
so each large request that came after a free had left only smaller blocks made a segment
of its own: ResNet-50's pool (batch 32, bf16 autocast) grew to 76 segments of 2-50 MB,
1574 MB reserved for 1313 MB ever alive at once, against `reduce-overhead`'s 1498 (H200,
thirty-first session). Carved from one segment reserved up front, neighbouring blocks
merge again as they are freed: reserving the forward's planned peak took ResNet-50's pool
to 1366 MB and GPT-2's from 2632 to 2256.

It is not a rule, though: BERT's went from 2188 to 2440. Its forward's peak is three
238 MB buffers of the language-model head alive at once, and in one segment the third
found only a 226 MB hole, so it took a segment of its own on top of the reservation; as
separate segments, it had reused a freed one. So the runtime asks the allocator's model
(allocator_model.py) first: it replays the graph's own plan (the requests its warm-up will
make, in order) with and without the reservation, and reserves only where the model
predicts a smaller pool. The reservation is the plan's peak of live bytes in requests the
large pool serves (over 1 MiB): what the pool must hold at that moment under any
allocator. The graphs that join the family later (a backward) allocate in what is left,
and past it in segments of their own, as before.

cuBLAS's workspace counts too: dropped before a warm-up or capture (capture_context.py),
the first matmul allocates it again in the pool, where it stays until the capture ends.
Left out of the model, DeBERTa-v2's inference pool reserved its 300 MB peak, the 32 MB
workspace landed inside it, and the 250 MB logits took a segment of their own: 648 MB
against `reduce-overhead`'s 536 (H200, forty-fifth session; the model replaying the
allocator's recorded history gives those four segments exactly).
"""

from __future__ import annotations

from typing import Any, Optional

from fuselens.compiler.runtime.allocator_model import SMALL, replay, round_size
from fuselens.compiler.runtime.interpreter import ExternCall, Free, KernelCall

# Below this, the allocator's own segments (20 MiB for requests under 10 MiB) hold the
# graph's peak in one or two: nothing to gain.
MIN_RESERVATION = 32 << 20
# A reservation is made where the model predicts at least this share less reserved memory:
# the model is of the warm-up alone, not of the captures and the graphs joining later.
MIN_GAIN = 0.03


# The request key of cuBLAS's workspace: no buffer of a plan is named so.
WORKSPACE = "<cublas workspace>"
# Extern calls whose ATen kernels call cuBLAS, by the op's name (its overload aside).
_CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "_scaled_mm", "_int_mm",
                         "_grouped_mm", "matmul", "linear", "mv", "addmv", "dot", "vdot"})


def _calls_cublas(step: ExternCall) -> bool:
    name = getattr(step.target, "__name__", str(step.target)).split(".")[0]
    return step.reinterpret is None and name in _CUBLAS_OPS


def plan_requests(plan: list[Any], facts: Any, takes: dict[str, str],
                  workspace: int = 0) -> list[tuple[str, str, int]]:
    """The allocator requests a static graph's run makes, in order: ("alloc", buffer,
    block bytes) and ("free_requested", buffer, bytes), for the buffers it allocates (its
    inputs are not its own). A buffer written over a dying one (`facts.took`) or taking
    a dead one's storage (`takes`, the wrapper's buffer reuse) allocates nothing, and the
    storage it took is freed when it dies. With `workspace` bytes, the first matmul also
    allocates cuBLAS's workspace (`WORKSPACE`), alive to the end."""
    storage: dict[str, str] = {}  # buffer -> the buffer whose allocation its storage is
    handed_on = set(facts.took.values()) | set(takes.values())
    out: list[tuple[str, str, int]] = []

    def made(name: str) -> None:
        src = takes.get(name) or facts.took.get(name)
        if src is not None:
            if src in storage:
                storage[name] = storage[src]
            return
        nbytes = facts.nbytes.get(name)
        if nbytes:
            storage[name] = name
            out.append(("alloc", name, round_size(nbytes)))

    for step in plan:
        if isinstance(step, KernelCall):
            for name, *_ in step.alloc:  # one written in place over its input is in `facts.took`
                made(name)
        elif isinstance(step, ExternCall):
            if workspace and _calls_cublas(step):
                out.append(("alloc", WORKSPACE, round_size(workspace)))
                workspace = 0
            for o in step.outputs if isinstance(step.outputs, list) else [step.outputs]:
                if isinstance(o, str):
                    made(o)
        elif isinstance(step, Free):
            for n in step.names:
                if n in storage and n not in handed_on:
                    root = storage.pop(n)
                    out.append(("free_requested", root, facts.nbytes[root]))
    return out


def large_peak(requests: list[tuple[str, str, int]]) -> int:
    """The most bytes alive at once in requests over 1 MiB."""
    live = peak = 0
    sizes: dict[str, int] = {}
    for action, name, nbytes in requests:
        if action == "alloc":
            sizes[name] = nbytes
            if nbytes > SMALL:
                live += nbytes
                peak = max(peak, live)
        elif name in sizes:
            n = sizes.pop(name)
            live -= n if n > SMALL else 0
    return peak


def reservation_bytes(plan: list[Any], facts: Any, takes: dict[str, str], workspace: int = 0) -> int:
    """The bytes to reserve before a static graph's first warm-up in a new pool (an
    inference graph's: its capture, its warm-up runs outside the pools), its first matmul
    allocating a cuBLAS workspace of `workspace` bytes there; 0 where the model predicts
    no gain."""
    requests = plan_requests(plan, facts, takes, workspace)
    peak = large_peak(requests)
    if peak < MIN_RESERVATION:
        return 0
    without = replay(requests).reserved_mb()
    with_reservation = replay(requests, peak).reserved_mb()
    return peak if with_reservation <= without * (1 - MIN_GAIN) else 0


def graph_reservation(wrapper: Any, workspace: int = 0) -> int:
    """`reservation_bytes` of a generated wrapper's graph; 0 for a graph without a static
    plan (dynamic shapes) or one that runs without the printed wrapper."""
    runner: Optional[Any] = getattr(wrapper, "runner", None)
    facts = getattr(runner, "storage", None)
    if facts is None:
        return 0
    return reservation_bytes(runner.plan, facts, getattr(wrapper, "takes", {}), workspace)
