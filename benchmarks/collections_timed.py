"""Python's garbage collections during a block of code, timed by generation: cProfile
charges a collection to whatever function allocated when it began, so a profile alone
does not show them (benchmarks.compile_profile reports them beside its phases). The
older generations' passes are also listed one by one, with where each began: a pass
over the middle or oldest generation can cost as much as a compile phase, and which
code's allocation set it off (the compile, Dynamo's `gc.collect(1)` after it, the first
run) says whose objects it scanned."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
import time
from typing import Iterator, Optional


@dataclasses.dataclass
class OlderPass:
    """One collection of generation 1 or 2."""

    generation: int
    began_s: float  # after the block began
    seconds: float
    collected: int
    frozen: int  # objects frozen (`gc.freeze`) when it began: they are not scanned
    where: list[str]  # the innermost Python frames when it began, innermost first


def _where(depth: int = 8) -> list[str]:
    frame = sys._getframe(2)  # the caller of the collector's callback
    out = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        out.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}")
        frame = frame.f_back
    return out


@contextlib.contextmanager
def collections_timed(older: Optional[list[OlderPass]] = None) -> Iterator[dict[int, tuple[int, float]]]:
    """Generation -> (passes, seconds) of the collections during the block; each pass of
    an older generation is also appended to `older` when given."""
    out: dict[int, tuple[int, float]] = {}
    t0 = time.perf_counter()
    started = [0.0]
    pending: list[OlderPass] = []

    def callback(phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            started[0] = now
            if older is not None and info["generation"] >= 1:
                pending.append(OlderPass(info["generation"], round(now - t0, 3), 0.0, 0, gc.get_freeze_count(),
                                         _where()))
            return
        n, t = out.get(info["generation"], (0, 0.0))
        out[info["generation"]] = (n + 1, t + now - started[0])
        if pending and info["generation"] >= 1:
            p = pending.pop()
            p.seconds, p.collected = round(now - started[0], 4), info["collected"]
            older.append(p)  # type: ignore[union-attr]

    gc.callbacks.append(callback)
    try:
        yield out
    finally:
        gc.callbacks.remove(callback)
