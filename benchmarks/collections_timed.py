"""Python's garbage collections during a block of code, timed by generation: cProfile
charges a collection to whatever function allocated when it began, so a profile alone
does not show them (benchmarks.compile_profile reports them beside its phases)."""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Iterator


@contextlib.contextmanager
def collections_timed() -> Iterator[dict[int, tuple[int, float]]]:
    """Generation -> (passes, seconds) of the collections during the block."""
    out: dict[int, tuple[int, float]] = {}
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        n, t = out.get(info["generation"], (0, 0.0))
        out[info["generation"]] = (n + 1, t + time.perf_counter() - started[0])

    gc.callbacks.append(callback)
    try:
        yield out
    finally:
        gc.callbacks.remove(callback)
