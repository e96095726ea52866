"""CUDA graphs that share one memory pool (compiler/runtime/cuda_graph_pool.py): a training
forward, its backward and the graphs between them, on the CPU's simulated capture
(tests/cuda_graph_simulation.py). Which pool a graph joins, what a replay may write over
and what makes it capture again alone, how gradients and saved activations survive the
next replay, and a forward called twice before its backwards.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from cuda_graph_simulation import Fn, InPlaceFn, _captures, _capturing, _pool_memory, _step, simulated_cuda

from fuselens.compiler.runtime import cuda_graphs, step_clock
from fuselens.compiler.runtime.cuda_graph_pool import GraphFamily
from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner

__all__ = ["simulated_cuda"]  # the fixture, imported for the tests here


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


def test_two_copies_of_a_model_sharing_one_compiled_graph_replay_a_capture_each(simulated_cuda: None) -> None:
    """Dynamo compiles two copies of one model (a GAN's two critics, a teacher and its
    student of one class) once, with the parameters as inputs: their calls alternate on
    the same runners with other parameters. Each copy's forward and backward keep a capture
    of their own, replayed in turn. Before, every switch captured both again, and the
    backward soon stopped reading the saved activations in place and copied them on every
    replay: two copies of Llama trained at 0.67x reduce-overhead on the H200."""
    w1, w2 = torch.nn.Parameter(torch.full((4,), 2.0)), torch.nn.Parameter(torch.full((4,), 3.0))
    # and a buffer each (a rotary embedding's frequencies), which Dynamo marks static
    b1, b2 = torch.full((4,), 1.0), torch.full((4,), 2.0)
    fw = CudaGraphRunner(Fn(lambda x, w, b: x * w + b), "0/0:aot_forward", None, static_inputs={2})
    bw = CudaGraphRunner(Fn(lambda a, g: a * g), "0/0:aot_backward", None)
    for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        for w, b in ((w1, b1), (w2, b2)):
            (out,) = bw([fw([torch.full((4,), v), w, b])[0], torch.full((4,), 10.0)])
            assert torch.equal(out, 10.0 * (v * w.detach() + b))
    assert fw.captures_made == bw.captures_made == 2 and fw.borrow and bw.borrow
    assert len(fw.captures()) == len(bw.captures()) == 2 and fw.conflicts == bw.conflicts == 0
    assert {id(c.static[1]) for c in fw.captures()} == {id(w1), id(w2)}


def test_a_model_given_new_parameters_again_and_again_keeps_a_bounded_number_of_captures(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each new set of parameters may be another layer or another copy of the model, so its
    capture is kept beside the others; a model given new parameters for good keeps at most
    POSITIONS_PER_SIGNATURE captures, the least recently replayed dropped with its
    parameters, and past twice as many sets it runs with plain launches and says why. Every
    result stays right."""
    monkeypatch.setattr(cuda_graphs, "POSITIONS_PER_SIGNATURE", 4)
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/0:aot_forward", None)
    first = None
    for v in range(2, 10):  # eight sets: each a warm-up, a capture, a replay
        w = torch.nn.Parameter(torch.full((4,), float(v)))
        first = first or weakref.ref(w)
        for _ in range(3):
            assert torch.equal(fw([torch.ones(4), w])[0], torch.full((4,), float(v)))
        assert len(fw.captures()) <= 4
    gc.collect()
    assert fw.captures_made == 8 and fw.graphs[next(iter(fw.graphs))].static[1] is w and first() is None
    assert not fw.failed
    w = torch.nn.Parameter(torch.full((4,), 10.0))
    assert torch.equal(fw([torch.ones(4), w])[0], torch.full((4,), 10.0))
    assert "9 sets of parameters" in fw.failed and not fw.captures()


class SavesWeight(Fn):
    """A forward that hands its weight back as a saved tensor, as AOTAutograd's forwards
    return the primals their backward reads."""

    def __call__(self, args: list) -> list:
        w = args[1]
        return [*super().__call__(args), w]


def _layer_steps(fa: CudaGraphRunner, fb: CudaGraphRunner, ba: CudaGraphRunner, bb: CudaGraphRunner,
                 layers: list, steps: int, bw_reads: str, calls: "Generations | None" = None) -> None:
    """Training steps through `layers`, each run as two compiled graphs (a graph break inside
    the layer: fa then fb forward, bb then ba backward, the forward's outputs saved for the
    backward), with every output checked against the same arithmetic in eager. The
    backwards read the layer's weights (`bw_reads`): as an input of their own ("weights"),
    as fa handed them back ("saved-weights"), or not at all ("saved"). `calls`: Dynamo's
    generation, moved at each step's call into the compiled model."""
    for step in range(steps):
        if calls is not None:
            calls.bump()
        x = torch.full((4,), float(step + 1))
        want, saved, handed = x.clone(), [], []
        for w in layers:
            x, *back = fa([x, w])
            handed.append(back[0] if back else None)
            saved.append(x)
            x = fb([x, w])[0]
            saved.append(x)
            want = want * w.detach() + w.detach()
        assert torch.equal(x, want), step
        g = torch.ones(4)
        want_g = g.clone()
        for w in reversed(layers):
            w = {"weights": w, "saved-weights": handed.pop(), "saved": w.detach()}[bw_reads]
            a = saved.pop()
            want_g = a + w.detach() + want_g
            g = bb([a, w, g])[0]
            a = saved.pop()
            want_g = a * w.detach() * want_g
            g = ba([a, w, g])[0]
            del a
        assert torch.allclose(g, want_g), step


@pytest.mark.parametrize("clock", ["each-call-a-step", "dynamo-steps"])
@pytest.mark.parametrize("bw_reads", ["weights", "saved-weights", "saved"])
def test_a_graph_break_inside_a_repeated_layer_captures_each_layer_in_one_pool_in_step_order(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch, bw_reads: str, clock: str) -> None:
    """A graph break inside each of six layers: two forward graphs and two backward graphs,
    each run by every layer with its own weights (BART's training under transformers 5.17).
    Each layer is a position of its graphs: all warm up in the first step and capture in the
    second, in the order every later step replays them, into one pool; a backward waits for
    its forward's capture (it would read a warm-up's outputs). Before, a position captured in
    the first step came before the second step's first layer in the pool's order, its
    replays could write over that layer's activations, and the graphs ended on plain
    launches (0.33-0.52x reduce-overhead on the H200). From the third step each call finds
    its layer's capture without building its signature. A weight the forward hands back is
    no warm-up output: counted as one, it kept the backwards on warm-ups for good."""
    layers = [torch.nn.Parameter(torch.full((4,), 1.0 + k / 10)) for k in range(6)]
    fa = CudaGraphRunner((SavesWeight if bw_reads == "saved-weights" else Fn)(lambda x, w: x * w),
                         "0/1:aot_forward", None)
    fb = CudaGraphRunner(Fn(lambda x, w: x + w), "0/2:aot_forward", None)
    ba = CudaGraphRunner(Fn(lambda a, w, g: a * w * g), "0/1:aot_backward", None)
    bb = CudaGraphRunner(Fn(lambda a, w, g: a + w + g), "0/2:aot_backward", None)
    runners = [fa, fb, ba, bb]
    calls = Generations() if clock == "dynamo-steps" else None
    if calls is not None:  # the program's steps as a training loop makes them, not a step a call
        monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", step_clock.StepClock(calls))
    _layer_steps(*runners, layers, 1, bw_reads, calls)
    assert [r.captures_made for r in runners] == [0, 0, 0, 0]
    _layer_steps(*runners, layers, 1, bw_reads, calls)
    assert [r.captures_made for r in runners] == [6, 6, 6, 6]
    caps = [c for r in runners for c in r.captures()]
    (family,) = {c.family for c in caps}
    assert sorted(c.index for c in caps) == list(range(24))
    assert [c.index for c in sorted(caps, key=lambda c: c.index)][:2] == [0, 1]
    signatures = []
    real_key = CudaGraphRunner._key
    monkeypatch.setattr(CudaGraphRunner, "_key", staticmethod(lambda args: signatures.append(1) or real_key(args)))
    _layer_steps(*runners, layers, 3, bw_reads, calls)
    assert len(signatures) <= 4 * 2  # the third step's first search; none after
    assert [r.captures_made for r in runners] == [6, 6, 6, 6] and sum(r.conflicts for r in runners) == 0
    assert not any(r.failed for r in runners) and all(c.graph.replays == 4 for c in caps)
    assert all(c.lent for c in ba.captures())  # the saved activations read in place, not copied


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


def test_saved_activations_are_handed_out_again_and_held_while_autograd_saves_them() -> None:
    """Each replay hands out the same tensors for the saved activations (building 150-320 a
    step costs host time); the user's outputs are fresh. Such a tensor is held while autograd
    saves it, a backward with `retain_graph=True` keeps it, or anything else refers to it."""
    import gc

    from fuselens.compiler.runtime.cuda_graph_pool import CapturedOutputs

    logits, act, act2 = torch.ones(4), torch.ones(2), torch.ones(3)
    out = CapturedOutputs([logits, act, act2, act2[:1]], set(), set(), 0, saved_from=1)
    del act, act2
    first, second = out.tensors(), out.tensors()
    assert first[1] is second[1] and first[3] is second[3] and first[0] is not second[0]
    assert out.saved_held()
    del first, second
    assert not out.saved_held()

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(saved)
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple:
            (saved,) = ctx.saved_tensors
            return g * saved.sum(), None

    x = torch.ones(2, requires_grad=True)
    y = Scale.apply(x, out.tensors()[1])
    assert out.saved_held()
    y.sum().backward()
    assert not out.saved_held()
    y = Scale.apply(x, out.tensors()[2])
    y.sum().backward(retain_graph=True)
    assert out.saved_held()
    del y
    gc.collect()
    assert not out.saved_held()
    view = out.tensors()[3].view(1)
    assert out.saved_held()
    del view
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


class _WithConstant(Fn):
    """A compiled forward that also returns a constant it holds (Swin's folded attention
    mask), saved for the backward: AOTAutograd returns saved tensors as outputs."""

    def __init__(self, fn: Any, constant: torch.Tensor) -> None:
        super().__init__(fn)
        self.constants = {"_folded0": constant}

    def __call__(self, args: list) -> list:
        return [*super().__call__(args), self.constants["_folded0"]]


def test_a_constant_the_forward_saves_for_its_backward_is_not_a_held_activation(simulated_cuda: None) -> None:
    """A graph's constant returned as a saved activation is held by the graph for good: read
    as pool memory it looked held at every call, so Swin's forward captured again each step,
    then ran without CUDA graphs. It is the graph's, like a parameter, and the backward reads
    it in place."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    mask = torch.tensor([0.0, 1.0, 0.0, 1.0])
    fw = CudaGraphRunner(_WithConstant(lambda x, w: x * w * mask, mask), "0/0:aot_forward", None, saved_from=1)
    bw = CudaGraphRunner(Fn(lambda m, g: m * g), "0/0:aot_backward", None)
    for v in (1.0, 3.0, 5.0, 7.0, 9.0):
        out, saved = fw([torch.full((4,), v), w])
        assert torch.equal(out, 2.0 * v * mask)
        args = [saved, torch.full((4,), v)]
        del saved
        assert torch.equal(bw(args)[0], v * mask)
        del out
    assert fw.conflicts == bw.conflicts == 0 and not fw.failed and not bw.failed
    assert fw.captures_made == bw.captures_made == 1
    (b,) = bw.graphs.values()
    assert b.in_place == {0}  # the constant, not copied into a static buffer


def test_a_dropped_capture_whose_output_is_held_keeps_its_memory_when_nothing_else_refers_to_its_family(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One compiled forward run by four layers with their own weights: with three positions a
    signature, the fourth layer's capture (in the second step, after each layer's warm-up)
    drops one whose output the step still holds (for its backward). Parked in a family of its own, nothing referred to that family but the capture
    itself, and the cycle collector freed both, and the memory under the held output (on the
    CPU's simulated capture a backward read freed memory; on the GPU the pool would have gone
    back to the allocator). Kept alive while the output is held, it goes once it is let go, at
    the next replay of any graph."""
    monkeypatch.setattr(cuda_graphs, "POSITIONS_PER_SIGNATURE", 3)
    layers = [torch.nn.Parameter(torch.full((4,), 1.0 + k)) for k in range(4)]
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "7/0:aot_forward", None, saved_from=0)
    with torch.no_grad():
        for step in range(3):
            held = [fw([torch.full((4,), 1.0 + step), w])[0] for w in layers]
            gc.collect()
            junk = [torch.full((4,), -1.0) for _ in range(64)]  # what freed memory would be handed to next
            for k, h in enumerate(held):
                assert torch.equal(h, torch.full((4,), (1.0 + step) * (1.0 + k))), (step, k)
            del junk
    parked = [m for f in GraphFamily._holding for m in f.members if m.parked]
    assert parked  # the dropped captures, kept while the last step's outputs are held
    other = CudaGraphRunner(Fn(lambda x: x + 1), "9/0:aot_inference", None, inference=True)
    for _ in range(2):  # its warm-up and its capture, while the outputs are held
        other([torch.ones(4)])
    del held
    assert [f for f in GraphFamily._holding if any(m.runner() is fw for m in f.members)]
    other([torch.ones(4)])  # a replay, capturing nothing
    assert not [f for f in GraphFamily._holding if any(m.runner() is fw for m in f.members)]


def test_a_dropped_capture_lets_go_of_its_inputs_so_a_parameter_holding_its_output_as_gradient_is_freed(
        simulated_cuda: None) -> None:
    """`torch._dynamo.reset()` drops every capture; one whose output is still held stays,
    parked, until that output is let go. The holder may be its own input: a parameter it read
    in place, whose gradient is the output. Had the parked capture kept its inputs, the
    parameter, its gradient and the pool would have lived for good (on the GPU, 16 MB left
    after each training run of a two-layer model)."""
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    runner = CudaGraphRunner(Fn(lambda x, w: x * w), "8/0:aot_backward", None)
    with torch.no_grad():
        for _ in range(3):  # its warm-up, its capture, a replay
            w.grad = runner([torch.ones(4), w])[0]
    assert runner.captures_made == 1
    gone = weakref.ref(w)
    del w
    cuda_graphs.release_all()
    gc.collect()
    assert gone() is None
    assert not [f for f in GraphFamily._holding if any(m.runner() is runner for m in f.members)]


def test_a_layer_graph_fed_its_own_last_positions_output_keeps_its_captures_when_a_backward_reuses_that_memory(
        simulated_cuda: None) -> None:
    """One compiled graph per layer, each layer's input the output of the same graph's call
    for the layer before (BART's encoder layers), its backward in the same pool reusing those
    activations' memory for its gradients. An input at an address this graph's own capture
    writes is copied as at the capture, though another graph's replay writes there too later
    in the step: before, it read as "now another graph's output", and the layers captured
    anew every step (BART's training: 21 GB of pools against reduce-overhead's 6)."""
    layers = [torch.nn.Parameter(torch.full((4,), 1.0 + k / 10)) for k in range(6)]
    fw = CudaGraphRunner(Fn(lambda x, w: x * w), "0/1:aot_forward", None)
    bw = CudaGraphRunner(InPlaceFn(lambda a, w, g: a.mul_(w.detach()).mul_(g)), "0/1:aot_backward", None)
    for step in range(6):
        x = torch.full((4,), float(step + 1))
        want, saved = x.clone(), []
        for w in layers:
            x = fw([x, w])[0]
            saved.append(x)
            want = want * w.detach()
        assert torch.equal(x, want), step
        g, want_g = torch.ones(4), torch.ones(4)
        for w in reversed(layers):
            a = saved.pop()
            want_g = a * w.detach() * want_g
            g = bw([a, w, g])[0]
            del a
        assert torch.allclose(g, want_g), step
        del g
    assert fw.captures_made == 6 and bw.captures_made == 6, (fw.captures_made, bw.captures_made)
    assert not fw.failed and not bw.failed and fw.conflicts == bw.conflicts == 0


class Generations:
    """Dynamo's generation as the program would move it: `bump()` at each call into compiled
    code from eager code (the source of a real `cuda_graphs.StepClock`)."""

    def __init__(self) -> None:
        self.generation = 0

    def bump(self) -> None:
        self.generation += 1

    def __call__(self) -> tuple[str, int]:
        return ("generation", self.generation)


def _twice_a_step(f: CudaGraphRunner, b: CudaGraphRunner, calls: Generations, step: int) -> None:
    """A training step calling one weightless graph twice before the backward (BART's mask
    graph, for its encoder and its decoder; two views of a batch), each output saved for the
    backward, which runs for each in reverse. Each forward is a call into compiled code."""
    x1, x2 = torch.full((4,), float(step + 1)), torch.full((4,), float(step + 2))
    calls.bump()
    h1 = f([x1])[0]
    calls.bump()
    h2 = f([x2])[0]
    g = torch.ones(4)
    g2 = b([h2, g])[0]
    g1 = b([h1, g2])[0]
    assert torch.equal(g2, x2 * 2 + 1) and torch.equal(g1, x1 * 2 + x2 * 2 + 1), step


def test_a_graph_called_twice_a_step_warms_up_both_calls_and_captures_them_next_step_in_one_pool(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph with no weights of its own called twice in a step is one position: its second
    call used to capture in the first step, while that step's warm-ups still held their memory
    in the pool (BART's training on the H200: a 4.8 GB pool for that capture alone, and the
    second step's captures in pools of their own). Now both calls warm up in the first step,
    as reduce-overhead records only in a step after its warm-ups, and capture in the second,
    in step order, into one pool; the next steps replay them in that order."""
    calls = Generations()
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", step_clock.StepClock(calls))
    f = CudaGraphRunner(Fn(lambda x: x * 2), "0/0:aot_forward", None, saved_from=0)
    b = CudaGraphRunner(Fn(lambda h, g: h + g), "0/0:aot_backward", None)
    _twice_a_step(f, b, calls, 0)
    assert (f.captures_made, b.captures_made) == (0, 0)
    _twice_a_step(f, b, calls, 1)
    assert (f.captures_made, b.captures_made) == (2, 2)
    caps = [*f.captures(), *b.captures()]
    assert len({c.family for c in caps}) == 1 and sorted(c.index for c in caps) == [0, 1, 2, 3]
    for step in range(2, 6):
        _twice_a_step(f, b, calls, step)
    assert (f.captures_made, b.captures_made) == (2, 2) and f.conflicts + b.conflicts == 0
    assert not f.failed and not b.failed and all(c.graph.replays == 5 for c in caps)


def test_a_graph_called_again_and_again_within_one_step_captures_after_a_few_warm_ups(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One call into compiled code that runs a graph many times (a whole loop compiled, with a
    graph break inside) has no next step: the graph captures at its WARM_UPS_IN_ONE_STEP-th
    call, where waiting for the next step would leave it without CUDA graphs for good."""
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", step_clock.StepClock(Generations()))
    f = CudaGraphRunner(Fn(lambda x: x * 2), "0/0:aot_inference", None, inference=True)
    calls = cuda_graphs.WARM_UPS_IN_ONE_STEP + 6
    for k in range(calls):
        assert torch.equal(f([torch.full((4,), float(k))])[0], torch.full((4,), 2.0 * k))
    assert f.captures_made == 1 and f.captures()[0].graph.replays == calls - cuda_graphs.WARM_UPS_IN_ONE_STEP
