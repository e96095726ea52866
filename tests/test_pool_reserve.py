"""pool_reserve.py: the requests a graph's plan makes of the allocator, the one segment a new
CUDA-graph pool reserves where the allocator's model predicts a smaller pool, and which
warm-ups reserve it (on the CPU's simulated capture, tests/cuda_graph_simulation.py; the
real allocator's segments are checked on the GPU in tests/test_gpu_lowering.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from cuda_graph_simulation import Fn, _allocating, _step, simulated_cuda

from fuselens.compiler.runtime.buffer_reuse import StorageFacts
from fuselens.compiler.runtime.cuda_graph_pool import GraphFamily
from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner
from fuselens.compiler.runtime.interpreter import ExternCall, Free, KernelCall
from fuselens.compiler.runtime.allocator_model import replay
from fuselens.compiler.runtime.pool_reserve import WORKSPACE, large_peak, plan_requests, reservation_bytes

__all__ = ["simulated_cuda"]  # the fixture, imported for the tests here

MB = 1 << 20
F32 = torch.float32


def _k(out: str, *reads: str) -> KernelCall:
    return KernelCall(f"k_{out}", None, [*reads, out], [out], [(out, 0, 1, F32)], [], takes_tensors=True)


def _facts(sizes: dict[str, int]) -> StorageFacts:
    return StorageFacts(dict(sizes), {n: F32 for n in sizes}, set(sizes), set(sizes))


def test_the_requests_are_the_graphs_own_buffers_with_a_taken_storage_freed_when_its_taker_dies() -> None:
    """Inputs are not the graph's to allocate or free; a buffer taking a dead one's storage
    (the wrapper's buffer reuse) allocates nothing, and the storage lives until it dies.
    A matmul's result (an extern call) is a request like a kernel's output."""
    plan = [_k("a", "x"), ExternCall("mm", torch.ops.aten.mm.default, (), {}, "mm"), Free(["x", "a"]),
            _k("c", "mm"), Free(["mm"]), _k("d", "c"), Free(["c"])]
    facts = _facts({"x": 500 * MB, "a": 40 * MB, "mm": 30 * MB, "c": 40 * MB, "d": 8 * MB})
    assert plan_requests(plan, facts, {"c": "a"}) == [
        ("alloc", "a", 40 * MB), ("alloc", "mm", 30 * MB), ("free_requested", "mm", 30 * MB),
        ("alloc", "d", 8 * MB), ("free_requested", "a", 40 * MB)]


def test_the_peak_counts_only_requests_the_large_pool_serves() -> None:
    requests = [("alloc", "a", 40 * MB), ("alloc", "tiny", MB), ("alloc", "b", 30 * MB),
                ("free_requested", "a", 40 * MB), ("alloc", "c", 50 * MB)]
    assert large_peak(requests) == 80 * MB


def test_freed_neighbours_that_only_one_segment_merges_make_the_pool_reserve_the_peak() -> None:
    """Two 20 MB temporaries, then a 40 MB one: as segments of their own the freed pair
    cannot serve it (80 MB in all); carved from one reserved 40 MB segment they merge."""
    plan = [_k("t1"), _k("t2", "t1"), Free(["t1", "t2"]), _k("x"), Free(["x"])]
    assert reservation_bytes(plan, _facts({"t1": 20 * MB, "t2": 20 * MB, "x": 40 * MB}), {}) == 40 * MB


def test_a_graph_whose_buffers_the_allocator_packs_as_well_without_reserves_nothing() -> None:
    plan = [_k("a"), _k("b", "a"), Free(["a"]), _k("c", "b"), Free(["b", "c"])]
    # each request reuses the last freed block or makes the segment a reservation would be
    assert reservation_bytes(plan, _facts({"a": 40 * MB, "b": 40 * MB, "c": 40 * MB}), {}) == 0


def test_a_graph_whose_peak_the_allocators_own_segments_hold_reserves_nothing() -> None:
    plan = [_k("t1"), _k("t2", "t1"), Free(["t1", "t2"]), _k("x"), Free(["x"])]
    assert reservation_bytes(plan, _facts({"t1": 6 * MB, "t2": 6 * MB, "x": 12 * MB}), {}) == 0


def _matmul_then_temporaries() -> tuple[list, StorageFacts]:
    """A small matmul (its result in the small pool), two 20 MB temporaries, then one of
    40 MB: the shape of DeBERTa-v2's inference graph, whose first matmul allocated cuBLAS's
    32 MB workspace inside the reserved segment and left its largest buffer no room."""
    plan = [ExternCall("mm", torch.ops.aten.mm.default, (), {}, "mm"), _k("t1", "mm"), _k("t2", "t1"),
            Free(["mm", "t1", "t2"]), _k("x"), _k("bmm_out", "x"), Free(["x", "bmm_out"])]
    return plan, _facts({"mm": MB // 2, "t1": 20 * MB, "t2": 20 * MB, "x": 40 * MB, "bmm_out": MB // 2})


def test_the_first_matmul_allocates_cublas_workspace_once_and_it_stays_to_the_end() -> None:
    plan, facts = _matmul_then_temporaries()
    plan.insert(4, ExternCall("bmm", torch.ops.aten.bmm.default, (), {}, "bmm"))
    facts.nbytes["bmm"] = MB // 2
    requests = plan_requests(plan, facts, {}, workspace=32 * MB)
    assert requests[0] == ("alloc", WORKSPACE, 32 * MB)
    assert [r for r in requests if r[1] == WORKSPACE] == [requests[0]]
    assert plan_requests(plan, facts, {})[0] == ("alloc", "mm", MB // 2)


def test_a_view_a_convolution_or_a_cumulative_max_allocates_no_cublas_workspace() -> None:
    plan = [ExternCall("v", torch.ops.aten.view.default, (), {}, "v", reinterpret=((4,), (1,), 0)),
            ExternCall("conv", torch.ops.aten.convolution.default, (), {}, "conv"),
            ExternCall("cummax", torch.ops.aten.cummax.default, (), {}, "cummax")]
    facts = _facts({"v": 0, "conv": 40 * MB, "cummax": 40 * MB})
    assert plan_requests(plan, facts, {}, workspace=32 * MB) == [("alloc", "conv", 40 * MB),
                                                                 ("alloc", "cummax", 40 * MB)]


def test_the_reservation_holds_the_workspace_beside_the_peak_so_the_largest_buffer_fits() -> None:
    """Reserving the buffers' 40 MB peak alone, the workspace takes 32 MB of it and every
    buffer after makes a segment of its own (120 MB, more than with no reservation); with
    the workspace counted, one 72 MB segment holds the whole run."""
    plan, facts = _matmul_then_temporaries()
    assert reservation_bytes(plan, facts, {}) == 40 * MB
    requests = plan_requests(plan, facts, {}, workspace=32 * MB)
    assert replay(requests, 40 * MB).reserved_mb() > replay(requests).reserved_mb()
    assert reservation_bytes(plan, facts, {}, workspace=32 * MB) == 72 * MB
    assert [s // MB for s in replay(requests, 72 * MB).segments if s > 2 * MB] == [72]


class _PlannedFn(Fn):
    """A compiled graph with the plan its generated wrapper was printed from: two
    temporaries, then one the size of both (the reservation pays)."""

    def __init__(self, fn: Any, nbytes: int) -> None:
        super().__init__(fn)
        plan = [_k("t1"), _k("t2", "t1"), Free(["t1", "t2"]), _k("x"), Free(["x"])]
        self.runner = SimpleNamespace(plan=plan, storage=_facts({"t1": nbytes, "t2": nbytes, "x": 2 * nbytes}))
        self.takes: dict[str, str] = {}


def test_a_new_pools_first_warm_up_reserves_inside_the_pool_before_it_runs_and_a_joining_backward_nothing(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reservation is made in the pool (between the allocator's begin and end calls),
    before the warm-up allocates anything there; the backward joins the forward's pool,
    whose segment it allocates in."""
    reserved: list[tuple[int, list]] = []
    monkeypatch.setattr(GraphFamily, "reserve", lambda self, n: reserved.append((n, list(_allocating))))
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    fw = CudaGraphRunner(_PlannedFn(lambda x, w: x * w, 32 * MB), "0/0:aot_forward", None)
    bw = CudaGraphRunner(_PlannedFn(lambda a, g: a * g, 48 * MB), "0/0:aot_backward", None)
    for v in (1.0, 3.0, 5.0):
        (out,) = _step(fw, bw, torch.full((4,), v), w, torch.full((4,), 10.0))
        assert torch.equal(out, torch.full((4,), 20.0 * v))
    (f,) = fw.graphs.values()
    assert reserved == [(64 * MB, [f.family.handle])]
