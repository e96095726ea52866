"""Device time of Triton kernels (option `time_kernels`).

On CUDA every launch is bracketed with CUDA events (`Launcher.__call__`); the
pending events resolve into totals only when `sink.flush()` runs `flush_timings`,
which streams the deltas as `KernelTiming` events, so timing synchronizes only
at flush. `cuda_event_timer` is the clock autotuning measures candidates with.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch


def cuda_event_timer(run: Callable[[], None], reps: int = 10) -> float:
    """Median-free mean device time of `run` in ms (3 warm-up launches)."""
    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


timing_lock = threading.Lock()
_timed: list[tuple[str, Any, list]] = []  # (graph_id, launcher, [calls, us] flushed so far)
_flusher_registered = False


def register_timing(graph_id: str, lib: Any) -> None:
    """Let `sink.flush()` emit KernelTiming events for this graph's kernels."""
    global _flusher_registered
    from fuselens import sink

    with timing_lock:
        for la in lib.launchers.values():
            la.graph_id = graph_id
            _timed.append((graph_id, la, [0, 0.0]))
        if not _flusher_registered:
            sink.add_flusher(flush_timings)
            _flusher_registered = True


def register_extra_timer(graph_id: str, name: str) -> "ExtraTimer":
    t = ExtraTimer(name)
    with timing_lock:
        _timed.append((graph_id, t, [0, 0.0]))  # type: ignore[arg-type]
    return t


class ExtraTimer:
    """Device time of work that is not one of our kernels (CUDA-graph input copies, replays)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stats_calls = 0
        self.stats_us = 0.0
        self.pending: list[tuple[Any, Any]] = []


def flush_timings() -> None:
    """Resolve pending CUDA events into totals; emit the deltas since the last flush."""
    from fuselens import sink
    from fuselens.events import KernelTiming

    with timing_lock:
        entries = list(_timed)
    for graph_id, la, last in entries:
        with timing_lock:
            pending, la.pending = la.pending, []
        for s, e in pending:
            e.synchronize()
            la.stats_calls += 1
            la.stats_us += s.elapsed_time(e) * 1000.0
        if la.stats_calls > last[0]:
            sink.emit(KernelTiming(name=la.name, graph_id=graph_id, calls=la.stats_calls - last[0],
                                   total_time_us=la.stats_us - last[1]))
            last[0], last[1] = la.stats_calls, la.stats_us
