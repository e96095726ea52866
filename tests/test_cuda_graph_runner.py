"""The CUDA-graph runner's bookkeeping (compiler/runtime/cuda_graphs.py) on the CPU.

CI has no GPU, so CUDA's graph capture is simulated here, and only that: a captured
"graph" keeps its outputs' memory (as its pool does) and replays by running the graph's
function again into the addresses its capture returned, as a real replay writes the same
addresses; the allocator's pool calls are recorded, not made (the reuse of freed memory
inside a pool is not simulated). Everything else is the runner's own code (cuda_graphs.py,
cuda_graph_pool.py): which inputs are copied or read in place, when it captures again,
which pool a graph joins, what a replay may overwrite, and how a backward's parameter
gradients are handed to autograd. The real capture runs in tests/test_gpu_lowering.py on
the GPU machine.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Any

import pytest
import torch

from fuselens.compiler.runtime import cuda_graph_pool, cuda_graphs
from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner


class _Graph:
    def __init__(self) -> None:
        self.replays = 0
        self.rerun: Any = None
        self.memory: list[torch.Tensor] = []  # what a real graph's pool keeps: its outputs' memory

    def replay(self) -> None:
        self.replays += 1
        self.rerun()


class _Stream:
    def __init__(self, device: Any = None) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass


_capturing: list[_Graph] = []
# the allocator's pool calls, in order: ("begin" | "end" | "release" | "capture", pool, ...)
_pool_calls: list[tuple] = []


@contextlib.contextmanager
def _graph(g: _Graph, pool: Any = None, stream: Any = None, **_: Any):
    _pool_calls.append(("capture", pool, stream))
    _capturing.append(g)
    try:
        yield
    finally:
        _capturing.pop()


@pytest.fixture()
def simulated_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _graph)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _Stream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda_graphs, "_warm_up_streams", {})
    handles = iter(range(1, 1 << 20))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(handles)))
    monkeypatch.setattr(cuda_graph_pool, "_POOL_CALLS", True)
    for name, what in (("_cuda_beginAllocateCurrentThreadToPool", "begin"), ("_cuda_endAllocateToPool", "end"),
                       ("_cuda_releasePool", "release")):
        monkeypatch.setattr(torch._C, name, lambda device, pool, what=what: _pool_call(what, pool), raising=False)
    monkeypatch.setattr(torch, "empty_strided", _empty_strided)
    _allocating.clear()
    _pool_memory.clear()
    gc.collect()  # earlier tests' families release their pools when they go: not among this test's calls
    _pool_calls.clear()


_allocating: list[Any] = []  # the pools this thread allocates from now (begin ... end)
_pool_memory: list[torch.Tensor] = []  # what the pools allocated: a real pool keeps it after its tensors are freed
_real_empty_strided = torch.empty_strided


def _pool_call(what: str, pool: Any) -> None:
    _pool_calls.append((what, pool))
    if what == "begin":
        _allocating.append(pool)
    elif what == "end":
        _allocating.pop()


def _empty_strided(size: Any, stride: Any, **kw: Any) -> torch.Tensor:
    """Memory the pool keeps when allocated in one (the runner's copies of its inputs): the
    tensor owns none of it, so that a capture freeing it after its last read leaves it to
    its replays, as a real pool does."""
    mem = _real_empty_strided(size, stride, **kw)
    if not _allocating:
        return mem
    _pool_memory.append(mem)
    return _at_address(mem)


def _at_address(t: torch.Tensor) -> torch.Tensor:
    """A tensor over the memory `t` has now, owning nothing: what a replay writes to."""
    st = torch._C._construct_storage_from_data_pointer(t.data_ptr(), t.device, t.untyped_storage().nbytes())
    return torch.empty(0, dtype=t.dtype).set_(st, 0, t.shape, t.stride())


def _in_pool(t: torch.Tensor) -> torch.Tensor:
    """`t`'s values in memory the capturing graph keeps, as a real graph's pool keeps its
    outputs' memory after the tensors the capture returned are gone (replays write there)."""
    mem = t.clone()
    _capturing[-1].memory.append(mem)
    return _at_address(mem).copy_(t)


class Runner:
    """A compiled graph's function: out = [x * w + k]; under capture it also records how
    to recompute into the memory it returned, reading its inputs' memory (a replay works
    on addresses, whichever tensors hold them later)."""

    def __call__(self, args: list) -> list:
        x, w, k = args
        outs = [x * w + k]
        if _capturing:
            outs = [_in_pool(outs[0])]
            xm, wm, om = _at_address(x), _at_address(w), _at_address(outs[0])
            _capturing[-1].rerun = lambda: om.copy_(xm * wm + k)
        return outs


def test_the_cycle_collector_is_held_off_during_a_capture_and_restored_after(simulated_cuda: None,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph dropped in a reference cycle, collected in the middle of another graph's
    capture, is a CUDA call capture forbids (an illegal memory access on an H200)."""
    collector_on: list[bool] = []

    @contextlib.contextmanager
    def recording_graph(g: _Graph, **kw: Any):
        collector_on.append(gc.isenabled())
        with _graph(g, **kw):
            yield

    monkeypatch.setattr(torch.cuda, "graph", recording_graph)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    assert gc.isenabled()
    for _ in range(3):
        r([torch.ones(4), w, 1.0])
    assert collector_on == [False] and gc.isenabled()


def test_warm_ups_and_captures_run_between_two_drops_of_cublas_workspaces(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """cuBLAS keeps a workspace per handle and stream for good. Dropped before, a capture
    allocates its own in its pool, not one that someone frees later (its replays would
    write there); dropped after, it is not held among the activations (32-65 MB)."""
    events: list[str] = []
    monkeypatch.setattr(cuda_graphs, "_clear_library_workspaces", lambda: events.append("clear"))

    class Recording(Runner):
        def __call__(self, args: list) -> list:
            events.append("capture" if _capturing else "run")
            return super().__call__(args)

    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Recording(), "0/0:aot_forward", None)
    for _ in range(4):
        r([torch.ones(4), w, 1.0])
    assert events == ["clear", "run", "clear", "clear", "capture", "clear"]


def test_replays_copy_inputs_read_parameters_in_place_and_capture_again_when_one_moves(simulated_cuda: None) -> None:
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    run = Runner()
    r = CudaGraphRunner(run, "0/0:aot_inference", None)
    first = r([torch.ones(4), w, 1.0])  # the warm-up: a real run
    assert torch.equal(first[0], torch.full((4,), 3.0)) and not r.graphs
    assert torch.equal(r([torch.ones(4), w, 1.0])[0], torch.full((4,), 3.0))  # capture, and a replay for the result
    for v in (5.0, 7.0):
        out = r([torch.full((4,), v), w, 1.0])
        assert torch.equal(out[0], torch.full((4,), 2 * v + 1))
    (entry,) = r.graphs.values()
    assert entry.graph.replays == 3 and len(r.graphs) == 1
    with torch.no_grad():
        w.mul_(3)  # updated in place (an optimizer step): read in place, no new capture
    assert torch.equal(r([torch.ones(4), w, 1.0])[0], torch.full((4,), 7.0))
    moved = torch.nn.Parameter(torch.full((4,), 10.0))
    assert torch.equal(r([torch.ones(4), moved, 1.0])[0], torch.full((4,), 11.0))  # a new address: captured again
    (again,) = r.graphs.values()
    assert again.graph is not entry.graph and again.static[1] is moved
    assert torch.equal(r([torch.full((4,), 2.0), moved, 1.0])[0], torch.full((4,), 21.0))
    assert torch.equal(r([torch.ones(4), moved, 2.0])[0], torch.full((4,), 12.0))  # another scalar: its warm-up
    assert torch.equal(r([torch.ones(4), moved, 2.0])[0], torch.full((4,), 12.0))  # and its graph
    assert torch.equal(r([torch.ones(4), moved, 2.0])[0], torch.full((4,), 12.0))
    assert torch.equal(r([torch.ones(4), moved, 1.0])[0], torch.full((4,), 11.0))  # back to the first: no capture
    assert len(r.graphs) == 2 and sorted(e.graph.replays for e in r.graphs.values()) == [2, 3]


def test_a_capture_holds_neither_the_warm_ups_outputs_nor_the_graph_it_replaces(simulated_cuda: None) -> None:
    """A training forward's outputs are its saved activations: alive twice during a capture,
    they doubled the peak memory of a step (GPT-2: 6.1 GB against 3.3 GB for reduce-overhead)."""
    class Tracking(Runner):
        def __init__(self) -> None:
            self.made: list[weakref.ref] = []
            self.alive_at_capture: list[int] = []

        def __call__(self, args: list) -> list:
            if _capturing:
                self.alive_at_capture.append(sum(ref() is not None for ref in self.made))
            outs = super().__call__(args)
            self.made.append(weakref.ref(outs[0]))
            return outs

    run = Tracking()
    r = CudaGraphRunner(run, "0/0:aot_forward", None)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r([torch.ones(4), w, 1.0])  # the warm-up, whose output dies here
    out = r([torch.ones(4), w, 1.0])
    assert run.alive_at_capture == [0] and torch.equal(out[0], torch.full((4,), 3.0))
    del out
    out = r([torch.ones(4), torch.nn.Parameter(torch.full((4,), 5.0)), 1.0])  # a parameter moved: captured again
    assert run.alive_at_capture == [0, 0] and torch.equal(out[0], torch.full((4,), 6.0))
    assert len(r.graphs) == 1


def test_the_warm_up_is_the_first_call_run_in_the_pool_the_capture_then_uses_on_the_same_stream(
        simulated_cuda: None) -> None:
    """A signature's first call is a real run allocating from the pool its graph is then
    captured into (reduce-overhead's warm-ups do the same): the memory it frees is what the
    capture allocates again. A throwaway warm-up right before each capture ran a backward with
    every saved activation still alive, and the pool kept room for both. The family holds
    its pool from its first use. A parameter that moved before any replay is captured again
    in the same pool (the allocator still knows every tensor on it); after one, in a new one.
    Each capture first copies its input into the pool (the capture frees it after its last read)."""
    class Recording(Runner):
        def __call__(self, args: list) -> list:
            _pool_calls.append(("run",))
            return super().__call__(args)

    r = CudaGraphRunner(Recording(), "0/0:aot_forward", None)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r([torch.ones(4), w, 1.0])  # warm-up
    r([torch.ones(4), w, 1.0])  # capture
    moved = torch.nn.Parameter(torch.full((4,), 5.0))
    assert torch.equal(r([torch.ones(4), moved, 1.0])[0], torch.full((4,), 6.0))  # captured again: the kernels are warm
    r([torch.ones(4), moved, 1.0])  # a replay
    again = torch.nn.Parameter(torch.full((4,), 3.0))
    assert torch.equal(r([torch.ones(4), again, 1.0])[0], torch.full((4,), 4.0))
    first, second = (0, 1), (0, 2)
    stream = cuda_graphs._warm_up_streams[0]
    copy_in = [("begin", first), ("end", first), ("release", first)]
    assert _pool_calls == [("begin", first), ("end", first),  # the family takes its pool
                           ("begin", first), ("run",), ("end", first), ("release", first),  # the warm-up in it
                           *copy_in, ("capture", first, stream), ("run",), *copy_in, ("capture", first, stream),
                           ("run",), ("begin", second), ("end", second),  # the new family takes its pool
                           ("begin", second), ("end", second), ("release", second),  # its copy of the input
                           ("capture", second, stream), ("run",)], _pool_calls


def test_a_replay_with_inputs_of_other_sizes_takes_the_slow_path_to_another_graph(simulated_cuda: None) -> None:
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    r([torch.ones(4), w, 1.0])
    r([torch.ones(4), w, 1.0])
    wide = torch.ones(2, 4)
    assert torch.equal(r([wide, w, 1.0])[0], torch.full((2, 4), 3.0))  # its warm-up
    assert torch.equal(r([wide, w, 1.0])[0], torch.full((2, 4), 3.0))
    assert len(r.graphs) == 2


def test_tensor_only_inputs_compare_addresses_in_one_call_with_the_signature_cuda_builds_have(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def ptrs_equal(tensors: list, data_ptrs: list, indices: list) -> bool:  # torch._C's, CUDA builds only
        assert all(isinstance(t, torch.Tensor) for t in tensors) and all(isinstance(p, int) for p in data_ptrs)
        calls.append(indices)
        return all(tensors[i].data_ptr() == data_ptrs[i] for i in indices)

    monkeypatch.setattr(cuda_graphs, "_PTRS_EQUAL", ptrs_equal)

    def run(args: list) -> list:
        x, w = args
        out = [x * w]
        if _capturing:
            out = [_in_pool(out[0])]
            xm, wm, om = _at_address(x), _at_address(w), _at_address(out[0])
            _capturing[-1].rerun = lambda: om.copy_(xm * wm)
        return out

    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(run, "0/0:aot_inference", None)
    r([torch.ones(4), w])
    r([torch.ones(4), w])
    assert torch.equal(r([torch.full((4,), 3.0), w])[0], torch.full((4,), 6.0))
    assert torch.equal(r([torch.full((4,), 4.0), w])[0], torch.full((4,), 8.0))
    assert calls == [[1], [1]]  # the replays after the capture took the fast path; the parameter is position 1


@pytest.mark.parametrize("can_move", [True, False], ids=["storage-moves", "torch-2.11-captures-again"])
def test_gradients_handed_out_are_not_held_by_the_runner_and_survive_the_next_replay(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch, can_move: bool) -> None:
    """A `.grad` kept from one replay (gradient accumulation) still has its values after the
    next replay; one dropped costs nothing (the graph keeps writing the same memory). A torch
    that cannot move a storage's memory captures a new graph instead, and hands out no more."""
    if can_move and not cuda_graphs._CAN_MOVE_STORAGE:
        pytest.skip("this torch cannot move a storage's memory")
    monkeypatch.setattr(cuda_graphs, "_CAN_MOVE_STORAGE", can_move)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_backward", None, gradient_outputs=[0])
    r([torch.ones(4), w, 0.0])  # warm-up
    r([torch.ones(4), w, 0.0])  # capture
    g1 = r([torch.full((4,), 1.0), w, 0.0])[0]
    (entry,) = r.graphs.values()
    pool = entry.outputs.buffers[0].ptr
    assert g1.data_ptr() == pool and not r._kept  # the graph's memory, a tensor only the caller holds
    held = g1  # like p.grad while accumulating
    del g1
    g2 = r([torch.full((4,), 5.0), w, 0.0])[0]
    assert torch.equal(held, torch.full((4,), 2.0))
    assert torch.equal(g2, torch.full((4,), 10.0))
    if not can_move:  # the held gradient keeps the old graph's memory; the new graph hands out none
        assert held.data_ptr() == pool and g2.data_ptr() != pool
        g3 = r([torch.full((4,), 3.0), w, 0.0])[0]
        assert torch.equal(g3, torch.full((4,), 6.0)) and any(k is g3 for k in r._kept)
        assert torch.equal(held, torch.full((4,), 2.0))
        return
    assert held.data_ptr() != pool and g2.data_ptr() == pool  # moved out before the replay
    del held, g2
    g3 = r([torch.full((4,), 3.0), w, 0.0])[0]
    assert torch.equal(g3, torch.full((4,), 6.0)) and g3.data_ptr() == pool  # nothing held: nothing moved


def test_dynamo_reset_drops_every_captured_graph_and_what_it_held(simulated_cuda: None) -> None:
    """`torch._dynamo.reset()` reaches the backend's `reset`: a runner Dynamo's stale
    globals still reach lets go of its static inputs (a model's parameters) and outputs,
    and captures again if it is ever called again."""
    import fuselens.compiler

    fuselens.compiler.register()
    torch._dynamo.reset()
    torch.compile(lambda t: t + 1, backend="fuselens")(torch.ones(2))  # the backend Dynamo will reset
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    r([torch.ones(4), w, 1.0])
    out = r([torch.ones(4), w, 1.0])
    held, output = weakref.ref(w), weakref.ref(out[0])
    del w, out
    assert held() is not None and output() is None  # the graph holds its parameter, not what it handed out
    torch._dynamo.reset()
    assert r.graphs == {} and r.outputs == set()
    assert held() is None
    w3 = torch.nn.Parameter(torch.full((4,), 3.0))
    r([torch.ones(4), w3, 1.0])  # warms up again
    again = r([torch.ones(4), w3, 1.0])
    assert torch.equal(again[0], torch.full((4,), 4.0)) and len(r.graphs) == 1


def test_replaying_the_last_signature_hashes_no_signature(simulated_cuda: None) -> None:
    """A signature is a tuple per input, which Python hashes anew at every dict lookup:
    with ResNet-50's 321 inputs, three lookups a replay were 40-60 us of host time. The
    replay of the last signature keeps what it needs from the last call instead."""
    class Counting(dict):
        lookups = 0

        def __getitem__(self, k: Any) -> Any:
            Counting.lookups += 1
            return super().__getitem__(k)

        def get(self, k: Any, default: Any = None) -> Any:
            Counting.lookups += 1
            return super().get(k, default)

    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    r.graphs, r._plans = Counting(), Counting()
    r([torch.ones(4), w, 1.0])
    r([torch.ones(4), w, 1.0])
    Counting.lookups = 0
    for v in (5.0, 7.0):
        assert torch.equal(r([torch.full((4,), v), w, 1.0])[0], torch.full((4,), 2 * v + 1))
    assert Counting.lookups == 0


def test_a_capture_cuda_refuses_leaves_the_graph_running_as_compiled_with_a_finding(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What capture_check.py did not foresee: CUDA refuses the capture (an op that waits for
    the device). The call still returns its result, later calls run the graph as compiled,
    and the finding says so once."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    @contextlib.contextmanager
    def refusing(g: _Graph, **_: Any):
        yield
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph", refusing)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    with sink.collect() as events:
        outs = [r([torch.full((4,), v), w, 1.0])[0] for v in (1.0, 5.0, 7.0)]
    assert [o.tolist() for o in outs] == [[3.0] * 4, [11.0] * 4, [15.0] * 4]
    assert r.graphs == {} and "not permitted" in r.failed
    # the warm-up's, then the capture's copy of its input
    assert [c[0] for c in _pool_calls] == ["begin", "end", "begin", "end", "release", "begin", "end", "release"]
    (finding,) = [e for e in events if isinstance(e, ErrorEntry)]
    assert finding.kind == "fallback" and "0/0:aot_inference runs without CUDA graphs: its capture failed" in \
        finding.message


class Fn:
    """A compiled graph computing one output from its tensor inputs with `fn`; under capture
    its output is pool memory and its replay recomputes there from its inputs' addresses."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, args: list) -> list:
        ts = list(args)
        args.clear()  # the boxed convention: the caller's list no longer pins the inputs
        out = self.fn(*ts)
        if _capturing:
            out = _in_pool(out)
            mem, om = [_at_address(t) for t in ts], _at_address(out)
            _capturing[-1].rerun = lambda: om.copy_(self.fn(*mem))
        return [out]


def _captures() -> list:
    return [c[1] for c in _pool_calls if c[0] == "capture"]


def _step(fw: CudaGraphRunner, bw: CudaGraphRunner, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> list:
    """A training step's shape: the forward's output is saved for the backward, whose
    arguments are cleared before it runs (AOTAutograd clears the saved tensors)."""
    args = [fw([x, w])[0], g]
    return bw(args)


def test_a_backward_reading_its_forwards_outputs_in_place_captures_into_the_forwards_pool(
        simulated_cuda: None) -> None:
    """The backward joins the forward's memory pool, so its capture may reuse the memory
    of each saved activation once read (reduce-overhead's CUDA graph trees do the same):
    a pool per graph held the activations between steps under the backward's own pool."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None)
    for v in (1.0, 3.0, 5.0, 7.0):  # warm-ups, captures, replays
        (out,) = _step(fw, bw, torch.full((4,), v), w, torch.full((4,), 10.0))
        assert torch.equal(out, torch.full((4,), 20.0 * v))
    (f,), (b,) = fw.graphs.values(), bw.graphs.values()
    assert f.family is b.family and [f.index, b.index] == [0, 1]
    assert _captures() == [f.family.handle, f.family.handle]
    assert b.in_place == {0} and not f.outputs.held()  # read in place, and released once read
    assert fw.conflicts == bw.conflicts == 0 and fw.captures_made == bw.captures_made == 1


def test_a_graph_captured_after_its_family_replayed_takes_a_pool_of_its_own(simulated_cuda: None) -> None:
    """Once a graph of the family has replayed, the allocator no longer knows every tensor on
    the pool (replays hand out tensors it did not allocate): a capture there could take
    memory a live tensor is on."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None)
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # warm-ups
    fw([torch.ones(4), w])  # captured
    fw([torch.ones(4), w])  # a replay: the family is sealed
    (out,) = _step(fw, bw, torch.full((4,), 3.0), w, torch.full((4,), 2.0))
    assert torch.equal(out, torch.full((4,), 12.0))
    (f,), (b,) = fw.graphs.values(), bw.graphs.values()
    assert b.in_place == {0} and f.family is not b.family and f.family.handle != b.family.handle


def test_a_backward_whose_saved_activation_is_still_held_captures_again_alone_and_stays_right(
        simulated_cuda: None) -> None:
    """A saved activation its capture reused the memory of, still held when it replays
    (`retain_graph=True` keeps the saved tensors for another backward): the replay would
    write over it, so the backward captures again in a pool of its own, once."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None)
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # warm-ups
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # captures: the activation is released once read
    for v in (3.0, 4.0, 5.0):
        kept = fw([torch.full((4,), v), w])[0]  # kept past the backward
        (out,) = bw([kept, torch.full((4,), 10.0)])
        assert torch.equal(out, torch.full((4,), 20.0 * v)) and torch.equal(kept, torch.full((4,), 2.0 * v))
    assert bw.conflicts == 1 and "still held" in bw.last_conflict and fw.conflicts == 0
    (f,), (b,) = fw.graphs.values(), bw.graphs.values()
    assert f.family is not b.family and b.in_place == {0}


@pytest.mark.parametrize("mutated", [False, True], ids=["read", "mutated"])
def test_a_captures_copy_of_an_input_is_pool_memory_it_frees_after_its_last_read(
        simulated_cuda: None, mutated: bool) -> None:
    """A copied input (a backward's output gradient) is copied into the family's pool and
    nothing but the capture's run holds it, so the capture reuses its memory once read, as
    reduce-overhead's do (held for good outside the pool: BERT's logits' gradient, 238 MB).
    An input the graph mutates keeps a buffer of its own: its result is copied back from it."""
    seen: list[weakref.ref] = []

    class Watching(Fn):
        def __call__(self, args: list) -> list:
            if _capturing:
                seen.append(weakref.ref(args[1]))
            return super().__call__(args)

    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(Watching(lambda a, g: a * g), "0/0:aot_backward", None, mutated_inputs=[1] if mutated else [])
    with torch.no_grad():  # compiled graphs run so: autograd would save the copy here
        for v in (1.0, 2.0, 3.0):
            (out,) = _step(fw, bw, torch.full((4,), v), w, torch.full((4,), 10.0 * v))
            assert torch.equal(out, torch.full((4,), 20.0 * v * v))
    (b,) = bw.graphs.values()
    in_pool = b.static[1].data_ptr() in {m.data_ptr() for m in _pool_memory}
    assert len(seen) == 1 and (seen[0]() is None) != mutated and in_pool != mutated


def test_a_replay_that_must_capture_again_copies_nothing_into_the_pool_first(simulated_cuda: None) -> None:
    """The check of what a replay would overwrite comes before its input copies: a copy
    writes the pool, where the capture freed the input after its last read."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None)
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # warm-ups
    _step(fw, bw, torch.ones(4), w, torch.full((4,), 7.0))  # captures: the backward's copy of g holds 7
    (old,) = bw.graphs.values()
    copy_of_g = next(m for m in _pool_memory if m.data_ptr() == old.static[1].data_ptr())
    kept = fw([torch.full((4,), 3.0), w])[0]  # kept past the backward: its replay must not write over it
    (out,) = bw([kept, torch.full((4,), 10.0)])
    assert torch.equal(out, torch.full((4,), 60.0)) and bw.conflicts == 1
    assert torch.equal(copy_of_g, torch.full((4,), 7.0))


def test_a_graph_fed_its_own_last_output_copies_it_from_a_copy(simulated_cuda: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A recurrent state (`h = step(x, h)`) is this graph's last output, on the family's
    memory. Where it lies on the memory the input copies go to (the capture freed them after
    their last read; here the kernel wrote its output over its input's copy), it is copied
    from a copy of it, never from the pool memory the copies overwrite."""
    copied_from: list[tuple[int, int]] = []
    real_copy_all = cuda_graphs._copy_all

    def recording(dsts: list, srcs: list) -> None:
        copied_from.extend((s.untyped_storage().data_ptr(), s.untyped_storage().nbytes()) for s in srcs)
        real_copy_all(dsts, srcs)

    monkeypatch.setattr(cuda_graphs, "_copy_all", recording)
    w = torch.nn.Parameter(torch.full((4,), 0.5))
    r = CudaGraphRunner(InPlaceFn(lambda h, w: h.mul_(w).add_(1)), "0/0:aot_inference", None)
    h = torch.zeros(4)
    with torch.no_grad():
        for _ in range(6):
            want = h * 0.5 + 1
            h = r([h, w])[0]
            assert torch.equal(h, want)
    (cap,) = r.captures()
    assert h.data_ptr() == cap.static[0].data_ptr()  # the state lies on its own input's copy
    assert copied_from and not any(cuda_graphs._overlaps(p, p + n, cap.into_pool) for p, n in copied_from)


def test_overlaps_finds_a_shared_byte_with_sorted_ranges() -> None:
    ranges = [(100, 200), (300, 400)]
    assert [cuda_graphs._overlaps(s, s + n, ranges) for s, n in
            ((0, 100), (0, 101), (199, 1), (200, 100), (250, 60), (399, 5), (400, 10), (150, 300))] == \
        [False, True, True, False, True, True, False, True]


def test_an_output_of_an_earlier_step_still_held_is_overwritten_as_reduce_overhead_does(
        simulated_cuda: None) -> None:
    """Outputs are valid until the next step: a loss kept from the last step (the loop's
    variable, still bound while the next step runs) costs no capture."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    model = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    loss = CudaGraphRunner(Fn(lambda y: y + 1), "1/0:aot_forward", None)  # after a graph break
    last = None
    for v in (1.0, 2.0, 3.0, 4.0):
        logits = model([torch.full((4,), v), w])[0]
        last = loss([logits])[0]
        assert torch.equal(last, torch.full((4,), 2 * v + 1))
    (m,), (lo,) = model.graphs.values(), loss.graphs.values()
    assert m.family is lo.family and model.conflicts == loss.conflicts == 0


@pytest.mark.parametrize("can_move", [True, False], ids=["storage-moves", "torch-2.11-captures-again"])
def test_a_gradient_accumulated_across_steps_survives_the_next_forward_replay(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch, can_move: bool) -> None:
    """The backward's gradients may lie where the forward, captured first, writes: a `.grad`
    still held when the next forward replays is moved out first, or (a torch that cannot
    move a storage) the forward captures again in a pool of its own and the backward stops
    handing its gradients out."""
    if can_move and not cuda_graphs._CAN_MOVE_STORAGE:
        pytest.skip("this torch cannot move a storage's memory")
    monkeypatch.setattr(cuda_graphs, "_CAN_MOVE_STORAGE", can_move)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None, gradient_outputs=[0])
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # warm-ups
    (grad,) = _step(fw, bw, torch.ones(4), w, torch.ones(4))  # held like a .grad being accumulated into
    (b,) = bw.graphs.values()
    pool = b.outputs.buffers[0].ptr
    assert grad.data_ptr() == pool and torch.equal(grad, torch.full((4,), 2.0))
    (nxt,) = _step(fw, bw, torch.full((4,), 3.0), w, torch.ones(4))
    assert torch.equal(grad, torch.full((4,), 2.0)) and torch.equal(nxt, torch.full((4,), 6.0))
    if can_move:
        assert grad.data_ptr() != pool and fw.conflicts == 0  # moved out; the graphs replayed
    else:
        assert fw.conflicts == 1 and "gradient" in fw.last_conflict and not bw.hand_out
        assert grad.data_ptr() == pool


def test_a_gradient_written_over_a_copied_input_is_handed_out_and_survives_the_next_input_copy(
        simulated_cuda: None) -> None:
    """A kernel may write its output over an input it read last: the runner's static copy of
    that input. The output is still handed out fresh each replay (AccumulateGrad keeps it as
    `.grad` instead of cloning it), and one still held is moved out before the next replay
    copies its input there."""
    if not cuda_graphs._CAN_MOVE_STORAGE:
        pytest.skip("this torch cannot move a storage's memory")

    def in_place(args: list) -> list:
        x, w = args
        args.clear()
        out = x.mul_(w)
        if _capturing:
            xm, wm = _at_address(x), _at_address(w)
            _capturing[-1].rerun = lambda: xm.mul_(wm)
        return [out]

    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(in_place, "0/0:aot_backward", None, gradient_outputs=[0])
    r([torch.ones(4), w])  # warm-up
    r([torch.ones(4), w])  # capture
    g = r([torch.full((4,), 3.0), w])[0]
    (cap,) = r.graphs.values()
    assert g.untyped_storage().data_ptr() == cap.static[0].untyped_storage().data_ptr() and g is not cap.static[0]
    g2 = r([torch.full((4,), 5.0), w])[0]
    assert torch.equal(g, torch.full((4,), 6.0)) and torch.equal(g2, torch.full((4,), 10.0))
    assert g.data_ptr() != g2.data_ptr() == cap.static[0].data_ptr()


class InPlaceFn(Fn):
    """A backward writing its output over its first input, a saved activation it has read
    (kernels reuse a dead input's memory)."""

    def __call__(self, args: list) -> list:
        ts = list(args)
        args.clear()
        if not _capturing:
            return [self.fn(*ts)]
        mem = [_at_address(t) for t in ts]  # a capture records the kernels, running none
        _capturing[-1].rerun = lambda: self.fn(*mem)
        return [ts[0]]


@pytest.mark.parametrize("can_move", [True, False], ids=["storage-moves", "torch-2.11-captures-again"])
def test_a_gradient_written_over_a_saved_activation_is_handed_out_and_the_next_forward_spares_it(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch, can_move: bool) -> None:
    """BERT's backward writes 29 of its 106 gradients over saved activations it has read:
    the forward's memory. Handed out fresh, autograd keeps them as `.grad` (kept as the
    capture's tensors, they were cloned: 177 MB a step); one still held when the next
    forward replays over that memory is moved out first, or the forward captures again alone."""
    if can_move and not cuda_graphs._CAN_MOVE_STORAGE:
        pytest.skip("this torch cannot move a storage's memory")
    monkeypatch.setattr(cuda_graphs, "_CAN_MOVE_STORAGE", can_move)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(InPlaceFn(lambda a, g: a.mul_(g)), "0/0:aot_backward", None, gradient_outputs=[0])
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # warm-ups
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # captures
    (f,), (b,) = fw.graphs.values(), bw.graphs.values()
    assert [x.ptr for x in b.outputs.buffers] == [f.outputs.buffers[0].ptr]
    (g1,) = _step(fw, bw, torch.full((4,), 3.0), w, torch.full((4,), 10.0))
    (g2,) = _step(fw, bw, torch.full((4,), 5.0), w, torch.full((4,), 10.0))  # g1 still held, like a .grad
    assert g1 is not g2 and torch.equal(g2, torch.full((4,), 100.0))
    assert torch.equal(g1, torch.full((4,), 60.0))
    assert (fw.conflicts == 0) == can_move


def test_a_warm_up_reading_a_captured_graphs_output_allocates_in_a_pool_of_its_own(simulated_cuda: None) -> None:
    """A first call (a real run) allocating in a pool where a graph was captured could take the
    memory that graph's capture freed, which its replays write: nothing would keep them from
    writing over the warm-up's outputs. Only a capture, whose outputs are watched, joins."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    late = CudaGraphRunner(Fn(lambda a: a + 1), "1/0:aot_forward", None)
    fw([torch.ones(4), w])
    (out,) = fw([torch.ones(4), w])  # captured; nothing replayed yet
    (f,) = fw.graphs.values()
    assert torch.equal(late([out])[0], torch.full((4,), 3.0))  # its warm-up
    (family,) = late.warm.values()
    assert family is not f.family and not f.family.sealed
    assert torch.equal(late([fw([torch.ones(4), w])[0]])[0], torch.full((4,), 3.0))  # captured


def test_a_gradient_accumulated_over_steps_on_a_saved_activations_memory_costs_no_capture(
        simulated_cuda: None) -> None:
    """Accumulating into a `.grad` the backward wrote over a saved activation: the forward's
    replay moves it out, once; from then on neither graph mistakes the moved tensor for one
    still on the pool (it would capture again alone every step)."""
    if not cuda_graphs._CAN_MOVE_STORAGE:
        pytest.skip("this torch cannot move a storage's memory")
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(InPlaceFn(lambda a, g: a.mul_(g)), "0/0:aot_backward", None, gradient_outputs=[0])
    _step(fw, bw, torch.ones(4), w, torch.ones(4))  # warm-ups
    (grad,) = _step(fw, bw, torch.ones(4), w, torch.full((4,), 10.0))  # captures: grad is the capture's tensor
    total = grad.clone()
    for v in (2.0, 3.0, 4.0, 5.0):
        (g,) = _step(fw, bw, torch.full((4,), v), w, torch.full((4,), 10.0))
        grad += g  # like AccumulateGrad into a .grad kept across steps
        total += 20.0 * v
        del g
        assert torch.equal(grad, total)
    assert fw.conflicts == bw.conflicts == 0 and fw.captures_made == bw.captures_made == 1


def test_the_benchmarks_count_the_gradients_left_on_graph_memory_and_the_mb_autograd_cloned(
        simulated_cuda: None) -> None:
    from benchmarks.cuda_graph_pools import gradients_in_graph_memory

    w = torch.nn.Parameter(torch.full((4,), 2.0))
    module = torch.nn.Module()
    module.w = w
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None, gradient_outputs=[0])
    _step(fw, bw, torch.ones(4), w, torch.ones(4))
    _step(fw, bw, torch.ones(4), w, torch.ones(4))
    (w.grad,) = _step(fw, bw, torch.ones(4), w, torch.ones(4))
    assert gradients_in_graph_memory(module) == {"gradients": 1, "in_graph_memory": 1, "copied_mb": 0.0}
    w.grad = w.grad.clone()
    assert gradients_in_graph_memory(module) == {"gradients": 1, "in_graph_memory": 0, "copied_mb": 16 / 2 ** 20}


def test_two_forwards_before_their_backwards_keep_each_ones_saved_activations(simulated_cuda: None) -> None:
    """A training step that runs the forward twice before the backwards (two views of a batch,
    a siamese network): the second replay would write over the saved activations the first
    call's backward still needs. It takes a second capture with memory of its own, kept
    beside the first, and so does the backward reading its activations in place: from the
    second such step on, every call replays, in either order of the backwards."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None, saved_from=0)
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None)
    for _ in range(3):  # warm-ups, captures, a replay: one forward a step
        _step(fw, bw, torch.ones(4), w, torch.ones(4))
    made = []
    for v in (3.0, 5.0, 7.0, 9.0):
        first = [fw([torch.full((4,), v), w])[0], torch.ones(4)]
        second = [fw([torch.full((4,), 10 * v), w])[0], torch.ones(4)]
        backwards = [(second, 20.0 * v), (first, 2.0 * v)]
        for args, want in backwards if v != 7.0 else backwards[::-1]:
            assert torch.equal(bw(args)[0], torch.full((4,), want))
        made.append((fw.captures_made, bw.captures_made))
    assert made[1:] == [made[0]] * 3 and made[0] == (2, 2)
    assert fw.conflicts == bw.conflicts == 0 and not fw.failed and bw.borrow
    caps = bw.captures()
    assert len(caps) == 2 and all(c.in_place == {0} for c in caps)  # the activations read in place, not copied
    assert len({c.family.handle for c in fw.captures()}) == 2


def test_a_third_forward_before_the_backwards_captures_again_alone_once_the_signature_has_its_captures(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captures of one signature are bounded: with all of them holding saved activations
    still needed, the next call captures again in a pool of its own, replacing one."""
    monkeypatch.setattr(cuda_graphs, "CAPTURES_PER_SIGNATURE", 2)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None, saved_from=0)
    for _ in range(2):  # warm-up, capture
        fw([torch.ones(4), w])
    outs = [fw([torch.full((4,), v), w])[0] for v in (1.0, 2.0, 3.0)]
    assert [o[0].item() for o in outs] == [2.0, 4.0, 6.0]
    assert fw.conflicts == 1 and "still held" in fw.last_conflict and len(fw.captures()) == 2


def test_a_buffer_a_user_output_is_on_is_not_a_saved_activation() -> None:
    """A forward's outputs from `saved_from` on are saved for its backward; a buffer that also
    holds a user output (the logits, saved for the loss's backward) is the user's to keep."""
    from fuselens.compiler.runtime.cuda_graph_pool import CapturedOutputs

    logits, act = torch.ones(4), torch.ones(2)
    out = CapturedOutputs([logits, act, logits[:2]], set(), set(), 0, saved_from=1)
    assert [b.saved for b in out.buffers] == [False, True] and out.saved == [out.buffers[1]]
    del act
    assert not out.saved_held()
    held = out.tensors()[1]
    assert out.saved_held()
    del held
    assert not out.saved_held()


def test_graphs_replayed_out_of_capture_order_never_overwrite_an_output_of_the_same_step(
        simulated_cuda: None) -> None:
    """Outputs of an earlier step may be overwritten (the loop's last loss); a step is told by
    the family's first graph replaying again, after the others in capture order. Out of that
    order (the head called before the model) the head's output held now may be of this step:
    the model captures again alone rather than take it for last step's."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    model = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    head = CudaGraphRunner(Fn(lambda a: a + 1), "1/0:aot_forward", None)  # reads the model's output in place
    for v in (1.0, 2.0, 3.0):  # warm-ups, captures, a replay in order
        logits = model([torch.full((4,), v), w])[0]
        kept = head([logits])[0]  # still held when the next step begins
    (m,), (h,) = model.graphs.values(), head.graphs.values()
    assert m.family is h.family and model.conflicts == head.conflicts == 0
    logits = model([torch.full((4,), 4.0), w])[0]
    kept = head([logits])[0]  # in order: the last step's `kept` was overwritten, as reduce-overhead does
    assert model.conflicts == 0 and torch.equal(kept, torch.full((4,), 9.0))
    fresh = head([logits])[0]  # the head again, out of order: its output is of this step
    after = model([torch.full((4,), 5.0), w])[0]
    assert model.conflicts == 1 and torch.equal(after, torch.full((4,), 10.0))
    assert torch.equal(fresh, torch.full((4,), 9.0))
