"""The CUDA-graph runner's bookkeeping for one graph (compiler/runtime/cuda_graphs.py), on
the CPU's simulated capture (tests/cuda_graph_simulation.py): which inputs are copied or
read in place, when it warms up and captures again, how a replay finds its graph, how its
outputs and a backward's parameter gradients are handed out, and what a refused capture
leaves. Graphs sharing a pool: tests/test_cuda_graph_families.py.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Any

import pytest
import torch
from cuda_graph_simulation import (Fn, InPlaceFn, Runner, _at_address, _capturing, _Graph, _graph, _in_pool, _pool_calls,
                                   simulated_cuda)

from fuselens.compiler.runtime import capture_context, capture_inputs, captured_graph, cuda_graphs, step_clock
from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner

__all__ = ["simulated_cuda"]  # the fixture, imported for the tests here


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
    monkeypatch.setattr(capture_context, "_clear_library_workspaces", lambda: events.append("clear"))

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
    # a new address (another layer, another copy of the model): its warm-up, then its capture
    assert torch.equal(r([torch.ones(4), moved, 1.0])[0], torch.full((4,), 11.0))
    assert r.graphs[next(iter(r.graphs))] is entry and r.captures_made == 1
    assert torch.equal(r([torch.full((4,), 3.0), moved, 1.0])[0], torch.full((4,), 31.0))
    (again,) = r.graphs.values()
    assert again.graph is not entry.graph and again.static[1] is moved and r.spares[next(iter(r.spares))] == [entry]
    assert torch.equal(r([torch.full((4,), 2.0), moved, 1.0])[0], torch.full((4,), 21.0))
    assert torch.equal(r([torch.ones(4), moved, 2.0])[0], torch.full((4,), 12.0))  # another scalar: its warm-up
    assert torch.equal(r([torch.ones(4), moved, 2.0])[0], torch.full((4,), 12.0))  # and its graph
    assert torch.equal(r([torch.ones(4), moved, 2.0])[0], torch.full((4,), 12.0))
    assert torch.equal(r([torch.ones(4), moved, 1.0])[0], torch.full((4,), 11.0))  # back to the first: no capture
    assert torch.equal(r([torch.ones(4), w, 1.0])[0], torch.full((4,), 7.0))  # the first position's capture, kept
    assert r.captures_made == 3 and len(r.graphs) == 2
    assert sorted(c.graph.replays for c in r.captures()) == [2, 3, 5]


@pytest.mark.parametrize("inference", [True, False])
def test_an_inference_graphs_warm_up_allocates_outside_the_pools_and_its_capture_makes_the_pool(
        simulated_cuda: None, inference: bool) -> None:
    """The caller keeps an inference graph's first output while its next call captures: in
    the graph's pool, the capture could not reuse that memory, and the pool held the output
    twice (GPT-2's logits: 1120 MB against reduce-overhead's 720 on an H200). Its warm-up
    allocates as eager does; the capture makes the pool. A training graph's warm-up still
    allocates in its family's pool (its backward reads its outputs there)."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None, inference=inference)
    first = r([torch.ones(4), w, 1.0])[0]  # the warm-up, kept by the caller
    warm_up_calls = list(_pool_calls)
    second = r([torch.full((4,), 2.0), w, 1.0])[0]  # the capture
    third = r([torch.full((4,), 3.0), w, 1.0])[0]  # a replay
    (cap,) = r.graphs.values()
    pool = cap.family.handle
    if inference:
        assert warm_up_calls == [] and r.warm == {next(iter(r.graphs)): None}
        assert ("begin", pool) in _pool_calls and ("capture", pool, capture_context.warm_up_stream(0)) in _pool_calls
    else:
        assert ("begin", pool) in warm_up_calls and r.warm[next(iter(r.graphs))] is cap.family
    assert torch.equal(first, torch.full((4,), 3.0)) and torch.equal(third, torch.full((4,), 7.0))
    assert torch.equal(second, torch.full((4,), 7.0))  # an earlier call's output: overwritten by the replay
    assert r.captures_made == 1 and not r.failed


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
    moved = torch.nn.Parameter(torch.full((4,), 5.0))
    r([torch.ones(4), moved, 1.0])  # a parameter moved: its warm-up
    out = r([torch.ones(4), moved, 1.0])  # and its capture, the first one kept as a spare (another layer's)
    assert run.alive_at_capture == [0, 0] and torch.equal(out[0], torch.full((4,), 6.0))
    assert len(r.graphs) == 1


def test_the_warm_up_is_the_first_call_run_in_the_pool_the_capture_then_uses_on_the_same_stream(
        simulated_cuda: None) -> None:
    """A signature's first call is a real run allocating from the pool its graph is then
    captured into (reduce-overhead's warm-ups do the same): the memory it frees is what the
    capture allocates again. A throwaway warm-up right before each capture ran a backward with
    every saved activation still alive, and the pool kept room for both. The family holds
    its pool from its first use. Parameters at a new address, reading no graph's output, are
    another position (another copy of the model): a warm-up and a capture in a family of its
    own. Each capture first copies its input into the pool (the capture frees it after its
    last read)."""
    class Recording(Runner):
        def __call__(self, args: list) -> list:
            _pool_calls.append(("run",))
            return super().__call__(args)

    r = CudaGraphRunner(Recording(), "0/0:aot_forward", None)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r([torch.ones(4), w, 1.0])  # warm-up
    r([torch.ones(4), w, 1.0])  # capture
    moved = torch.nn.Parameter(torch.full((4,), 5.0))
    r([torch.ones(4), moved, 1.0])  # another position's warm-up
    assert torch.equal(r([torch.ones(4), moved, 1.0])[0], torch.full((4,), 6.0))  # its capture
    r([torch.ones(4), moved, 1.0])  # a replay
    first, second = (0, 1), (0, 2)
    stream = capture_context._warm_up_streams[0]

    def family(pool: tuple) -> list:
        return [("begin", pool), ("end", pool),  # the family takes its pool
                ("begin", pool), ("run",), ("end", pool), ("release", pool),  # the warm-up in it
                ("begin", pool), ("end", pool), ("release", pool),  # the capture's copy of its input
                ("capture", pool, stream), ("run",)]
    assert _pool_calls == family(first) + family(second), _pool_calls


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

    monkeypatch.setattr(captured_graph, "PTRS_EQUAL", ptrs_equal)

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


def test_every_dynamo_reset_drops_the_graphs_even_of_a_compiled_function_older_than_a_reset(
        simulated_cuda: None) -> None:
    """Dynamo calls a backend's `reset` only for the backends `torch.compile` registered since
    the last reset. A model compiled once and called across resets (a notebook re-running
    its cells, the suite's turns) compiled again after the first reset, and the second one
    left those graphs, their pools and the model's parameters alive (H200, GPT-2 inference:
    910 MB reserved after the model was gone)."""
    import fuselens.compiler

    fuselens.compiler.register()
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: t + 1, backend="fuselens")
    compiled(torch.ones(2))
    torch._dynamo.reset()
    compiled(torch.ones(2))  # compiled again by the same `torch.compile`, now unknown to Dynamo's reset
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    r([torch.ones(4), w, 1.0])
    r([torch.ones(4), w, 1.0])
    held = weakref.ref(w)
    del w
    assert r.graphs and held() is not None
    torch._dynamo.reset()
    assert r.graphs == {} and held() is None


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
    the user's stream is current again, the finding says so once, and the runner lets its pools go."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    @contextlib.contextmanager
    def refusing(g: _Graph, stream: Any = None, **_: Any):
        torch.cuda.set_stream(stream)  # as torch.cuda.graph: its capture stream, not left when its end raises
        yield
        raise RuntimeError("operation not permitted when stream is capturing")

    users = torch.cuda.current_stream()

    monkeypatch.setattr(torch.cuda, "graph", refusing)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    with sink.collect() as events:
        outs = [r([torch.full((4,), v), w, 1.0])[0] for v in (1.0, 5.0, 7.0)]
    assert [o.tolist() for o in outs] == [[3.0] * 4, [11.0] * 4, [15.0] * 4]
    assert r.graphs == {} and "not permitted" in r.failed
    assert torch.cuda.current_stream() is users
    # the warm-up's, then the capture's copy of its input
    assert [c[0] for c in _pool_calls] == ["begin", "end", "begin", "end", "release", "begin", "end", "release"]
    (finding,) = [e for e in events if isinstance(e, ErrorEntry)]
    assert finding.kind == "fallback" and "0/0:aot_inference runs without CUDA graphs: its capture failed" in \
        finding.message
    # never replayed again: the warm-up's pool (reserved for the graph) is let go with the outputs on it
    assert r.warm == {}
    del outs
    gc.collect()
    assert [c[0] for c in _pool_calls][8:] == ["release"]


def test_a_graph_fed_its_own_last_output_copies_it_from_a_copy(simulated_cuda: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A recurrent state (`h = step(x, h)`) is this graph's last output, on the family's
    memory. Where it lies on the memory the input copies go to (the capture freed them after
    their last read; here the kernel wrote its output over its input's copy), it is copied
    from a copy of it, never from the pool memory the copies overwrite."""
    copied_from: list[tuple[int, int]] = []
    real_copy_all = cuda_graphs.copy_all

    def recording(dsts: list, srcs: list) -> None:
        copied_from.extend((s.untyped_storage().data_ptr(), s.untyped_storage().nbytes()) for s in srcs)
        real_copy_all(dsts, srcs)

    monkeypatch.setattr(cuda_graphs, "copy_all", recording)
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
    assert copied_from and not any(capture_inputs.overlaps(p, p + n, cap.into_pool) for p, n in copied_from)


def test_overlaps_finds_a_shared_byte_with_sorted_ranges() -> None:
    ranges = [(100, 200), (300, 400)]
    assert [capture_inputs.overlaps(s, s + n, ranges) for s, n in
            ((0, 100), (0, 101), (199, 1), (200, 100), (250, 60), (399, 5), (400, 10), (150, 300))] == \
        [False, True, True, False, True, True, False, True]


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


def test_an_expanded_input_is_copied_as_the_memory_it_spans_and_replays_right(simulated_cuda: None) -> None:
    """An attention mask expanded over the heads (stride 0): a copy_ into a static buffer of
    its own strides raised ("more than one element of the written-to tensor refers to a
    single memory location"), and BART's training graphs ran without CUDA graphs on the H200."""
    w = torch.nn.Parameter(torch.full((2, 3), 2.0))
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    for v in (1.0, 1.0, 5.0, 7.0):
        mask = torch.full((2, 1), v).expand(2, 3)
        assert torch.equal(r([mask, w, 1.0])[0], torch.full((2, 3), 2 * v + 1))
    assert not r.failed
    (entry,) = r.graphs.values()
    assert entry.graph.replays == 3 and entry.spans == {0} and entry.static[0].stride() == (1, 0)


def test_a_graph_run_by_many_layers_with_their_own_weights_captures_each_layer_once(simulated_cuda: None) -> None:
    """One compiled graph called by six layers a step, each with its own weights (a graph
    break inside a repeated block). Each layer is a position of the graph: warmed up in the
    first step, captured in the second, replayed from then on. Before, no capture read the
    next call's weights, each call captured again, and the graph ended on plain launches
    (BART's training: 62 captures, 0.33x reduce-overhead on the H200)."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    layers = [torch.nn.Parameter(torch.full((4,), float(k))) for k in range(6)]
    r = CudaGraphRunner(Runner(), "3/1:aot_inference", None)
    with sink.collect() as events:
        for step in range(5):
            for k, w in enumerate(layers):
                assert torch.equal(r([torch.full((4,), float(step)), w, 1.0])[0], torch.full((4,), step * k + 1.0))
    assert not r.failed and r.captures_made == 6 and len(r.captures()) == 6
    assert sorted(c.graph.replays for c in r.captures()) == [4] * 6  # the capture's own replay, then three steps
    assert not [e for e in events if isinstance(e, ErrorEntry)]


def test_a_graph_whose_upstream_graph_is_captured_anew_again_and_again_stops_capturing_and_says_why(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph reads another graph's output in place; that graph is dropped and captured anew
    (its output at a new address) again and again, so this one's capture never reads its next
    call's input. After RECAPTURES_BEFORE_PLAIN captures within RECAPTURE_WINDOW calls it runs
    with plain launches, says why once, and every result stays right."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    monkeypatch.setattr(cuda_graphs, "RECAPTURES_BEFORE_PLAIN", 3)
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    down = CudaGraphRunner(Fn(lambda h, w: h * w), "1/0:aot_forward", None)
    with sink.collect() as events:
        for k in range(6):
            up = CudaGraphRunner(Fn(lambda x: x + 1), f"0/{k}:aot_forward", None)
            for _ in range(2):  # the upstream graph's warm-up, then its capture
                h = up([torch.full((4,), float(k))])[0]
                assert torch.equal(down([h, w])[0], torch.full((4,), (k + 1.0) * 2))
            up.release()
    assert "captured 3 times in 48 calls" in down.failed and not down.captures()
    (finding,) = [e for e in events if isinstance(e, ErrorEntry)]
    assert finding.kind == "fallback" and "1/0:aot_forward runs without CUDA graphs" in finding.message


def test_a_graph_captured_again_now_and_then_keeps_capturing(simulated_cuda: None) -> None:
    """Weights moved once in a while (new ones loaded between evaluations) are captured again
    each time: the limit is on captures within a window of calls, not on captures in all."""
    r = CudaGraphRunner(Runner(), "0/0:aot_inference", None)
    for k in range(20):
        w = torch.nn.Parameter(torch.full((4,), float(k)))
        for _ in range(cuda_graphs.RECAPTURE_WINDOW // 4):
            assert torch.equal(r([torch.ones(4), w, 1.0])[0], torch.full((4,), k + 1.0))
    assert not r.failed and r.captures_made == 20


def test_a_graph_fed_a_users_tensor_and_another_graphs_output_in_turn_replays_a_capture_for_each(
        simulated_cuda: None) -> None:
    """One graph called twice a step with no weights of its own, once with a tensor of the
    user's and once with another graph's output in the same place (BART's mask graph, for its
    encoder and for its decoder). Each call replays a capture of its own: before, a capture
    copying its input was found only when it read in place, the graph captured anew on every
    call and ended on plain launches."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    mask = CudaGraphRunner(Fn(lambda m: m * 2), "7/0:aot_forward", None)
    up = CudaGraphRunner(Fn(lambda x: x + 1), "8/0:aot_forward", None)
    with sink.collect() as events:
        for step in range(12):
            user = torch.full((4,), float(step))
            assert torch.equal(mask([user])[0], user * 2)
            h = up([torch.full((4,), float(step))])[0]
            assert torch.equal(mask([h])[0], torch.full((4,), 2.0 * (step + 1)))
    assert not mask.failed and mask.captures_made <= 3 and len(mask.captures()) == 2
    (by_user,) = [c for c in mask.captures() if not c.lent]
    (by_graph,) = [c for c in mask.captures() if c.lent]
    assert by_user.graph.replays >= 8 and by_graph.graph.replays >= 8
    assert not [e for e in events if isinstance(e, ErrorEntry)]


def test_the_step_clock_begins_a_step_at_a_compiled_call_once_no_forward_waits_for_its_backward() -> None:
    """Steps as reduce-overhead's CUDA graph trees count generations: each call into compiled
    code (Dynamo's generation) begins one, but not while a training forward's backward has
    not run (two views of a batch, then one backward), and never at a backward (a loss
    compiled apart from its model); a user's `cudagraph_mark_step_begin()` begins one anyway."""
    source = [("generation", 1)]
    clock = step_clock.StepClock(lambda: source[0])

    def call(generation: Any, role: str) -> int:
        source[0] = generation if isinstance(generation, tuple) else ("generation", generation)
        return clock.of_call(role == "backward", role == "forward")

    # model and loss compiled apart, one step: forward, loss forward, both backwards
    assert [call(1, "forward"), call(2, "forward"), call(2, "backward"), call(2, "backward")] == [1, 1, 1, 1]
    assert [call(3, "forward"), call(4, "forward"), call(4, "backward"), call(4, "backward")] == [2, 2, 2, 2]
    # two views of a batch through the model, then one backward: one step
    assert [call(5, "forward"), call(6, "forward"), call(6, "backward")] == [3, 3, 3]
    # inference calls: a step each; a forward whose backward never runs holds the step
    assert [call(7, "inference"), call(8, "inference"), call(9, "forward"), call(10, "forward")] == [4, 5, 6, 6]
    assert call(("marked", -1), "forward") == 7  # the user's mark
    assert call(("marked", -1), "inference") == 7


def test_dynamos_generation_moves_at_each_call_into_compiled_code_and_not_at_its_backward() -> None:
    """What `compiled_calls` reads: this torch's own counters, through a real compiled
    function (a torch without them would leave every call a step of its own)."""
    f = torch.compile(torch.nn.Linear(4, 4), backend="eager")
    seen = []
    for _ in range(3):
        y = f(torch.randn(2, 4))
        seen.append(step_clock.compiled_calls())
        y.sum().backward()
        assert step_clock.compiled_calls() == seen[-1]
    assert seen[0][0] == "generation" and [g for _, g in seen] == [seen[0][1] + k for k in range(3)]
