"""CUDA's graph capture simulated on the CPU, for the CUDA-graph runner's tests
(tests/test_cuda_graph_runner.py: one graph; tests/test_cuda_graph_families.py: graphs
sharing a memory pool).

CI has no GPU, so CUDA's graph capture is simulated here, and only that: a captured
"graph" keeps its outputs' memory (as its pool does) and replays by running the graph's
function again into the addresses its capture returned, as a real replay writes the same
addresses; the allocator's pool calls are recorded, not made (the reuse of freed memory
inside a pool is not simulated; what a pool allocates stays allocated). Everything else is
the runner's own code (cuda_graphs.py, cuda_graph_pool.py). The real capture runs in
tests/test_gpu_lowering.py on the GPU machine.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import pytest
import torch

from fuselens.compiler.runtime import capture_context, cuda_graph_pool, cuda_graphs
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
    device_index = 0

    def __init__(self, device: Any = None) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass


_capturing: list[_Graph] = []


_pool_calls: list[tuple] = []


@contextlib.contextmanager
def _graph(g: _Graph, pool: Any = None, stream: Any = None, **_: Any):
    _pool_calls.append(("capture", pool, stream))
    _use_count[pool] = _use_count.get(pool, 0) + 1
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
    current = [_Stream()]  # the device's stream until one is set, as CUDA's current stream
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: current.__setitem__(0, s))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100 / H200
    monkeypatch.setattr(capture_context, "_warm_up_streams", {})
    handles = iter(range(1, 1 << 20))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(handles)))
    monkeypatch.setattr(cuda_graph_pool, "_POOL_CALLS", True)
    for name, what in (("_cuda_beginAllocateCurrentThreadToPool", "begin"), ("_cuda_endAllocateToPool", "end"),
                       ("_cuda_releasePool", "release")):
        monkeypatch.setattr(torch._C, name, lambda device, pool, what=what: _pool_call(what, pool), raising=False)
    monkeypatch.setattr(torch, "empty_strided", _empty_strided)
    # the tests call runners directly, not through a compiled function, so Dynamo's generation
    # never moves: each call is a step of its own unless a test sets a `StepClock` of its own
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", _EachCall())
    monkeypatch.setattr(cuda_graph_pool.GraphFamily, "_latest", {})  # no earlier test's family to join
    _allocating.clear()
    _pool_memory.clear()
    gc.collect()  # earlier tests' families release their pools when they go: not among this test's calls
    _pool_calls.clear()
    _use_count.clear()


_allocating: list[Any] = []  # the pools this thread allocates from now (begin ... end)


_pool_memory: list[torch.Tensor] = []  # what the pools allocated: a real pool keeps it after its tensors are freed


_real_empty_strided = torch.empty_strided


# each pool's use count, as CUDA's caching allocator keeps it: a begin or a capture into the
# pool adds one, a release takes one, and a release below zero is its `uc >= 0` assertion
# (which aborted a process running two backends' CUDA graphs, thirty-seventh session). A
# captured graph's own release at its destruction is not simulated: counts here are at least
# CUDA's, so a release that fails here fails there too.
_use_count: dict[Any, int] = {}


def _pool_call(what: str, pool: Any) -> None:
    _pool_calls.append((what, pool))
    if what == "begin":
        _use_count[pool] = _use_count.get(pool, 0) + 1
        _allocating.append(pool)
    elif what == "end":
        _allocating.pop()
    elif what == "release":
        _use_count[pool] = _use_count.get(pool, 0) - 1
        assert _use_count[pool] >= 0, f"pool {pool} released once more than it was used"


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


class _EachCall:
    """Every call a step of its own (`step_clock.StepClock`'s place in the tests)."""

    def __init__(self) -> None:
        self.step = 0

    def of_call(self, backward: bool, training_forward: bool) -> int:
        self.step += 1
        return self.step


def _captures() -> list:
    return [c[1] for c in _pool_calls if c[0] == "capture"]


def _step(fw: CudaGraphRunner, bw: CudaGraphRunner, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> list:
    """A training step's shape: the forward's output is saved for the backward, whose
    arguments are cleared before it runs (AOTAutograd clears the saved tensors)."""
    args = [fw([x, w])[0], g]
    return bw(args)


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
