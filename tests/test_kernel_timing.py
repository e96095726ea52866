"""One kernel-timing mechanism (fuselens/kernel_timing.py): a KernelTimer per compiled
graph, one registry a run collects KernelTiming events from and then clears."""

from __future__ import annotations

import gc
import os

import pytest

from fuselens import kernel_timing, sink
from fuselens.events import KernelTiming
from fuselens.kernel_timing import CudaEvents, KernelTimer

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")


@pytest.fixture(autouse=True)
def _fresh_registry():
    kernel_timing.clear()  # timers of other tests' graphs are not this test's to collect
    yield
    kernel_timing.clear()


def _collected() -> list[KernelTiming]:
    with sink.collect() as events:
        sink.flush()
    return [e for e in events if isinstance(e, KernelTiming)]


class _FakeCudaEvent:
    """FAKE, no GPU here: stands in for torch.cuda.Event so the CUDA-event path's bookkeeping
    runs on the CPU. Each event is one tick of a fake device clock (2.5 ms apart); it counts
    how often it was waited for, so the test can tell timing did not wait inside a step."""

    ticks = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = None
        self.waited = 0

    def record(self) -> None:
        _FakeCudaEvent.ticks += 1
        self.at = _FakeCudaEvent.ticks * 2.5

    def synchronize(self) -> None:
        self.waited += 1

    def elapsed_time(self, end: "_FakeCudaEvent") -> float:
        assert end.waited, "elapsed_time before the end event was waited for"
        return end.at - self.at


def _fake_cuda_clock(capturing: bool = False) -> CudaEvents:
    """A CudaEvents clock whose torch.cuda parts are the fake above (no GPU here)."""
    clock = CudaEvents.__new__(CudaEvents)
    clock._event = _FakeCudaEvent
    clock._capturing = lambda: capturing
    return clock


def test_cuda_event_times_resolve_only_when_collected():
    timer = KernelTimer("0/0:aot_inference", _fake_cuda_clock())
    ends = []
    for _ in range(3):
        started = timer.start()
        timer.stop("triton_fused_exp_0", started)
        ends.append(timer._tally.pending[-1][2])
    assert not any(e.waited for e in ends)  # launching never waited for the device
    assert timer.totals() == {}  # nothing resolved yet
    (timing,) = _collected()
    assert all(e.waited == 1 for e in ends)
    assert (timing.name, timing.graph_id, timing.calls) == ("triton_fused_exp_0", "0/0:aot_inference", 3)
    assert timing.total_time_us == pytest.approx(3 * 2500.0)  # 2.5 ms each, in microseconds
    assert _collected() == []  # reported once


def test_a_launch_under_cuda_graph_capture_is_timed_on_the_host_clock():
    """FAKE CUDA clock (no GPU here): an event recorded while capturing would join the graph."""
    timer = KernelTimer("g", _fake_cuda_clock(capturing=True))
    timer.stop("k", timer.start())
    assert timer._tally.pending == [] and timer.totals()["k"].calls == 1


def test_host_clock_times_are_streamed_as_deltas_in_microseconds():
    timer = KernelTimer("g")
    timer.record("cpp_fused_0", 0.002)
    timer.record("cpp_fused_0", 0.001)
    (first,) = _collected()
    assert (first.calls, first.total_time_us) == (2, pytest.approx(3000.0))
    timer.record("cpp_fused_0", 0.001)
    (second,) = _collected()
    assert (second.calls, second.total_time_us) == (1, pytest.approx(1000.0))
    assert timer.totals()["cpp_fused_0"].calls == 3


def test_the_registry_does_not_keep_a_freed_graphs_timer_alive_but_reports_its_last_times():
    timer = KernelTimer("freed")
    timer.record("k", 0.001)
    del timer
    gc.collect()
    assert kernel_timing.live_timers() == []
    (timing,) = _collected()
    assert timing.graph_id == "freed" and timing.calls == 1
    assert _collected() == [] and kernel_timing._registered == []  # forgotten once reported


def test_clear_forgets_every_timer_and_one_that_measures_again_rejoins():
    timer = KernelTimer("g")
    timer.record("k", 0.001)
    kernel_timing.clear()
    assert kernel_timing.live_timers() == [] and _collected() == []
    timer.record("k", 0.001)
    assert kernel_timing.live_timers() == [timer]
    assert [t.calls for t in _collected()] == [1]


def test_the_fuselens_cpp_target_times_through_the_graphs_own_timer():
    import torch

    torch._dynamo.reset()
    cf = torch.compile(lambda x: (x * 2).exp() + 1, backend="fuselens", options={"time_kernels": True})
    x = torch.randn(64)
    for _ in range(3):
        cf(x)
    (timer,) = kernel_timing.live_timers()
    timings = _collected()
    assert [(t.graph_id, t.calls) for t in timings] == [(timer.graph_id, 3)] and timings[0].total_time_us > 0
    torch._dynamo.reset()


def test_a_rerun_in_the_same_worker_collects_from_its_own_graphs_only():
    """What the TUI does on `r`: the same worker runs the program again."""
    from fuselens.capture import RunOptions, Target, WorkerSession

    with WorkerSession(Target.from_cli(["timed_fuselens.py"], cwd=CORPUS)) as session:
        runs = [session.run(RunOptions(time_kernels=True, timeout_s=300)) for _ in range(2)]
    for report in runs:
        assert not report.errors, report.errors
        assert "timers 1" in report.run.stdout_tail  # the registry did not grow with the re-run
        calls = {k.name: k.calls for k in report.kernels if k.kind == "cpp"}
        assert calls and set(calls.values()) == {3}, calls  # not doubled by the earlier run's timers


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend, options, want", [
    ("inductor", [], None),
    ("fuselens", [], None),
    ("fuselens", ["cuda_graphs=1"], {"cudagraph_input_copies": 2, "cudagraph_replay": 2}),
], ids=["inductor", "fuselens-launches", "fuselens-cuda-graphs"])
def test_cuda_kernels_are_timed_by_cuda_events_without_compile_or_autotune(backend, options, want):
    """Real CUDA: three calls; compile and autotune launches are not counted. A fuselens
    Triton kernel's first launch (which compiles it) is untimed; under CUDA graphs the first
    call is the warm-up (a real run, untimed), the second captures and replays for its result,
    and only each replay and its input copies are timed."""
    from fuselens.capture import RunOptions, Target, analyze

    report = analyze(Target.from_cli(["timed_cuda.py", "--", backend, *options], cwd=CORPUS),
                     RunOptions(time_kernels=True, timeout_s=400))
    assert not report.errors and report.run.exit_code == 0, (report.errors, report.run.stdout_tail)
    calls = {k.name: k.calls for k in report.kernels if k.calls}
    assert all(k.total_time_us > 0 for k in report.kernels if k.calls)
    if want is not None:
        assert calls == want, calls
    else:
        expected = 3 if backend == "inductor" else 2
        generated = {n: c for n, c in calls.items() if n.startswith(("triton_", "cpp_"))}
        assert generated and set(generated.values()) == {expected}, calls
