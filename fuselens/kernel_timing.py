"""Kernel times: one mechanism for both compiler targets and for Inductor programs.

Each compiled graph owns a `KernelTimer`: fuselens's runtime gives one to a graph's
runner (the C++ kernels and library calls it times, the Triton launchers, the CUDA
graph's copies and replays), and capture/inductor.py keeps one per Inductor graph for
the profiler times it attributes. A timer measures a span with its device's clock:
the host clock on the CPU, where a kernel has finished when its call returns, and CUDA
events on the GPU, recorded around the launch and resolved only when the timer is
collected, so timing never synchronizes inside a step. Compile and autotune waits are
the producer's to leave out (a Triton kernel's first launch, Inductor's dynamo_timed
ranges): a timer counts what it is given.

`collect()` streams what every registered timer measured since the last collect as
`KernelTiming` events (calls, microseconds); it is a `sink` flusher, so the worker's
periodic and final `sink.flush()` run it. The registry holds timers weakly: a freed
graph's numbers are reported by the next collect, then forgotten with it. `clear()`
forgets every timer at the end of a run, so a kept worker's re-runs (the TUI's) start
from nothing; a timer that measures again afterwards registers again.

Torch-free at import: the capture side uses it without the compiler.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional


@dataclass
class KernelTotal:
    """Calls of one kernel and their summed time."""

    calls: int = 0
    us: float = 0.0


@dataclass
class _Tally:
    """One timer's numbers. The registry keeps it past its timer, until the next collect."""

    graph_id: str
    total: dict[str, KernelTotal] = field(default_factory=dict)  # since the timer was made
    unreported: dict[str, KernelTotal] = field(default_factory=dict)  # since the last collect
    pending: list[tuple[str, Any, Any]] = field(default_factory=list)  # (kernel, start, end) unresolved events
    listed: bool = False  # in the registry now
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kernel: str, calls: int, us: float) -> None:
        for book in (self.total, self.unreported):
            t = book.get(kernel)
            if t is None:
                t = book[kernel] = KernelTotal()
            t.calls += calls
            t.us += us

    def take(self) -> list[tuple[str, KernelTotal]]:
        """Resolve pending events (this waits for them), then hand over and forget the unreported."""
        with self.lock:
            pending, self.pending = self.pending, []
        resolved = []
        for kernel, start, end in pending:
            end.synchronize()
            resolved.append((kernel, start.elapsed_time(end) * 1000.0))  # ms -> us
        with self.lock:
            for kernel, us in resolved:
                self.add(kernel, 1, us)
            out, self.unreported = list(self.unreported.items()), {}
        return out


class HostClock:
    """The CPU's clock: a call has finished when it returns."""

    def start(self) -> float:
        return time.perf_counter()

    def stop(self, tally: _Tally, kernel: str, started: float) -> None:
        us = (time.perf_counter() - started) * 1e6
        with tally.lock:
            tally.add(kernel, 1, us)


class CudaEvents(HostClock):
    """CUDA events around a launch on the current stream, resolved when collected.
    While a stream is being captured into a CUDA graph an event would become part of
    the graph: the launch is then timed on the host clock."""

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event
        self._capturing = torch.cuda.is_current_stream_capturing

    def start(self) -> Any:
        if self._capturing():
            return super().start()
        e = self._event(enable_timing=True)
        e.record()
        return e

    def stop(self, tally: _Tally, kernel: str, started: Any) -> None:
        if isinstance(started, float):
            super().stop(tally, kernel, started)
            return
        e = self._event(enable_timing=True)
        e.record()
        with tally.lock:
            tally.pending.append((kernel, started, e))


def clock_for(device_type: str) -> HostClock:
    """The clock that measures kernels on a device of this type ("cuda", "cpu")."""
    return CudaEvents() if device_type == "cuda" else HostClock()


class KernelTimer:
    """The kernel times of one compiled graph (option `time_kernels`)."""

    def __init__(self, graph_id: str, clock: Optional[HostClock] = None) -> None:
        self.graph_id = graph_id
        self.clock = clock or HostClock()
        self._tally = _Tally(graph_id)
        _register(self)

    def start(self) -> Any:
        """A token for `stop`: taken just before the kernel's call or launch."""
        return self.clock.start()

    def stop(self, kernel: str, started: Any) -> None:
        """The call of `kernel` begun at `start` has been made (launched, on a device)."""
        if not self._tally.listed:
            _register(self)
        self.clock.stop(self._tally, kernel, started)

    def record(self, kernel: str, seconds: float) -> None:
        """One call of `kernel` that took `seconds` on the host clock (generated wrappers
        read the clock themselves: no token object per call)."""
        self.add(kernel, 1, seconds * 1e6)

    def add(self, kernel: str, calls: int, us: float) -> None:
        """Calls measured elsewhere (a profiler's totals)."""
        if not self._tally.listed:
            _register(self)
        with self._tally.lock:
            self._tally.add(kernel, calls, us)

    def totals(self) -> dict[str, KernelTotal]:
        """Every kernel's calls and time since the timer was made (pending events not yet resolved)."""
        with self._tally.lock:
            return {k: KernelTotal(t.calls, t.us) for k, t in self._tally.total.items()}


# -- the registry: what a run collects from -------------------------------------
_registered: list[tuple["weakref.ref[KernelTimer]", _Tally]] = []
_lock = threading.Lock()


def _register(timer: KernelTimer) -> None:
    from fuselens import sink

    with _lock:
        if not timer._tally.listed:
            timer._tally.listed = True
            _registered.append((weakref.ref(timer), timer._tally))
    sink.add_flusher(collect)


def live_timers() -> list[KernelTimer]:
    """The registered timers whose graphs are alive."""
    with _lock:
        return [t for ref, _ in _registered if (t := ref()) is not None]


def _collected() -> Iterator[tuple[str, str, KernelTotal]]:
    with _lock:
        entries = list(_registered)
        _registered[:] = [(ref, tally) for ref, tally in entries if ref() is not None]
    for _, tally in entries:
        for kernel, total in tally.take():
            yield tally.graph_id, kernel, total


def collect() -> None:
    """Emit a `KernelTiming` per kernel measured since the last collect (a sink flusher)."""
    from fuselens import sink
    from fuselens.events import KernelTiming

    for graph_id, kernel, total in _collected():
        if total.calls:
            sink.emit(KernelTiming(name=kernel, graph_id=graph_id, calls=total.calls, total_time_us=total.us))


def clear() -> None:
    """Forget every timer (the end of a run, after its last collect)."""
    with _lock:
        entries, _registered[:] = list(_registered), []
    for _, tally in entries:
        with tally.lock:
            tally.listed = False
            tally.unreported, tally.pending = {}, []
