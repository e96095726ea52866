"""One memory pool a step (compiler/runtime/cuda_graph_pool.py, `GraphFamily.latest`), on the
CPU's simulated capture (tests/cuda_graph_simulation.py): graphs with eager code between
them warm up and capture in one pool, what a replay asks before writing over the pool (and
how little), and graphs of several models sharing the pool in orders that change from
step to step.
"""

from __future__ import annotations

import gc
import random
import weakref
from typing import Any

import pytest
import torch
from cuda_graph_simulation import Fn, simulated_cuda
from test_cuda_graph_families import Generations, _layer_steps

from fuselens.compiler.runtime import cuda_graph_pool, cuda_graphs, step_clock
from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner

__all__ = ["simulated_cuda"]  # the fixture, imported for the tests here


def test_graphs_separated_by_eager_code_warm_up_and_capture_in_one_pool(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step whose graphs read only eager tensors (a mask built by an inference
    graph, a graph break's eager code between two forwards) shares one pool: the first
    step's warm-ups run in one, and the second step's captures join it, reusing what the
    warm-ups let go, as reduce-overhead's tree shares one. Each such graph had a pool of its
    own: BART's training on the H200 kept its first step's 4.8 GB warm-up pool beside the
    captures' 5.7 GB (10.7 GB against reduce-overhead's 6.1)."""
    calls = Generations()
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", step_clock.StepClock(calls))
    w = torch.nn.Parameter(torch.full((4,), 2.0))
    mask = CudaGraphRunner(Fn(lambda x: x + 1), "0/0:aot_inference", None, inference=True)
    fa = CudaGraphRunner(Fn(lambda x, m, w: x * w * m), "1/0:aot_forward", None, saved_from=0)
    fb = CudaGraphRunner(Fn(lambda h, w: h * w), "2/0:aot_forward", None, saved_from=0)
    bb = CudaGraphRunner(Fn(lambda h, g: h + g), "2/0:aot_backward", None)
    ba = CudaGraphRunner(Fn(lambda h, g: h * g), "1/0:aot_backward", None)
    warm_pools = []
    for step in range(6):
        with torch.no_grad():  # as AOTAutograd runs compiled graphs: no autograd graph holds their outputs
            _eager_code_between(mask, fa, fb, bb, ba, w, calls, step)
        if step == 0:
            assert all(r.captures_made == 0 for r in (mask, fa, fb, bb, ba))
            warm_pools = {f.handle for r in (fa, fb, bb, ba) for f in r.warm.values()}
    runners = (mask, fa, fb, bb, ba)
    caps = [c for r in runners for c in r.captures()]
    assert len(warm_pools) == 1 and {c.family.handle for c in caps} == warm_pools
    assert sorted(c.index for c in caps) == list(range(5))
    assert all(r.captures_made == 1 and r.conflicts == 0 and not r.failed for r in runners)
    assert all(c.graph.replays == 5 for c in caps)  # the capture's step and four more


def _eager_code_between(mask: CudaGraphRunner, fa: CudaGraphRunner, fb: CudaGraphRunner, bb: CudaGraphRunner,
                        ba: CudaGraphRunner, w: torch.Tensor, calls: Generations, step: int) -> None:
    """One training step of two forward graphs with eager code between them (a graph break),
    the first reading an inference graph's mask, and their backwards in reverse."""
    x = torch.full((4,), float(step + 1))
    calls.bump()
    m = mask([torch.ones(4)])[0]
    ha = fa([x, m, w])[0]
    calls.bump()  # the eager code between the graphs calls the next one
    hb = fb([ha.clone(), w])[0]
    gb = bb([hb, torch.ones(4)])[0]
    (ga,) = ba([ha, gb])
    assert torch.equal(ga, (x * 4) * (x * 8 + 1)), step


def test_a_replay_asks_whether_a_buffer_is_held_only_until_it_is_let_go(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve layers of two graphs each, forward and backward: 48 captures in one pool. Before
    each replay the runner asks which buffers it may write over are still held; a buffer let
    go stays so until its producer replays, and only members captured before a replay can
    have written this step's outputs, so a step asks about each buffer about once. Asking
    every member's buffers at every replay cost BART's training on the H200, one pool for its
    38 captures, 12k checks and ~100 ms of host time a step (fiftieth session)."""
    layers = [torch.nn.Parameter(torch.full((4,), 1.0 + k / 10)) for k in range(12)]
    fa = CudaGraphRunner(Fn(lambda x, w: x * w), "0/1:aot_forward", None)
    fb = CudaGraphRunner(Fn(lambda x, w: x + w), "0/2:aot_forward", None)
    ba = CudaGraphRunner(Fn(lambda a, w, g: a * w * g), "0/1:aot_backward", None)
    bb = CudaGraphRunner(Fn(lambda a, w, g: a + w + g), "0/2:aot_backward", None)
    calls = Generations()
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", step_clock.StepClock(calls))
    with torch.no_grad():
        _layer_steps(fa, fb, ba, bb, layers, 3, "weights", calls)
        asked = []
        held = cuda_graph_pool.PoolBuffer.held
        monkeypatch.setattr(cuda_graph_pool.PoolBuffer, "held", lambda b: asked.append(b) or held(b))
        _layer_steps(fa, fb, ba, bb, layers, 2, "weights", calls)  # checked against eager inside
    (family,) = {c.family for r in (fa, fb, ba, bb) for c in r.captures()}
    buffers = sum(len(m.outputs.buffers) for m in family.members)
    assert len(family.members) == 48 and len(asked) / 2 <= buffers, (len(asked) / 2, buffers)
    assert all(r.captures_made == 12 and r.conflicts == 0 and not r.failed for r in (fa, fb, ba, bb))


def test_the_first_graph_of_a_pool_replaying_after_another_within_one_step_spares_its_held_output(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Graphs of two models in one pool, called in another order from step to step (a GAN's
    critic alone, then generator and critic): the pool's first graph, replayed after another
    within one step of the program, is out of capture order, so the other's output it may
    write over is this step's and, still held, makes it capture again alone. It was taken for
    the start of the pool's next step, and that output for an earlier step's: written over."""
    calls = Generations()
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", step_clock.StepClock(calls))
    a = CudaGraphRunner(Fn(lambda x: x + 1), "0/0:aot_inference", None, inference=True)
    b = CudaGraphRunner(Fn(lambda x: x * 2), "1/0:aot_inference", None, inference=True)
    c = CudaGraphRunner(Fn(lambda x: x - 3), "2/0:aot_inference", None, inference=True)

    def step(order: list, k: int) -> dict:
        calls.bump()
        return {r.graph_id: r([torch.full((4,), float(k))])[0] for r in order}

    for k in range(2):  # warm-ups, then captures into one pool, in the order a, b, c
        step([a, b, c], k)
    assert len({cap.family for r in (a, b, c) for cap in r.captures()}) == 1
    step([a, b], 2)
    held = step([c, a], 3)  # c's output held while a replays, in the same step
    assert torch.equal(held["2/0:aot_inference"], torch.full((4,), 0.0))
    assert torch.equal(held["0/0:aot_inference"], torch.full((4,), 4.0))
    assert a.conflicts == 1 and "this step" in a.last_conflict and c.conflicts == 0


@pytest.mark.parametrize("seed", range(60))
def test_no_replay_writes_over_an_output_of_its_step_still_held_in_random_programs(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Programs of two to five graphs in one pool, called each step in one of a few orders or
    a random one, some reading the last graph's output, some outputs held to the step's end
    or into the next: before a replay may write over another graph's output (one not alive
    when it captured), that output, if written in this step of the program and still held,
    must make it capture again alone. The runner's cheap judgement (its pool's steps, buffers
    known let go, members in capture order) is checked against asking every buffer. It missed
    captures made earlier in the same program step as the pool's first graph's first replay."""
    rng = random.Random(seed)
    calls = Generations()
    clock = step_clock.StepClock(calls)
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", clock)
    n = rng.randint(2, 5)
    runners = [CudaGraphRunner(Fn(lambda x, k=k: x * 2 + k), f"{k}/0:aot_inference", None, inference=True)
               for k in range(n)]
    missed = _judged_against_every_buffer(monkeypatch, clock)
    orders = [rng.sample(runners, rng.randint(1, n)) for _ in range(3)]
    kept: list = []
    for step in range(40):
        calls.bump()
        order = rng.choice(orders) if rng.random() < 0.8 else rng.sample(runners, rng.randint(1, n))
        held, last = [], None
        for r in order:
            x = last if last is not None and rng.random() < 0.5 else torch.full((4,), float(step))
            want = x * 2 + int(r.graph_id.split("/")[0])
            last = r([x])[0]
            assert torch.equal(last, want), (step, r.graph_id)
            if rng.random() < 0.5:
                held.append(last)
        kept = held if rng.random() < 0.3 else []  # into the next step
        del held, last
    assert not missed and kept is not None, missed


def _judged_against_every_buffer(monkeypatch: pytest.MonkeyPatch, clock: step_clock.StepClock) -> list:
    """The runner's cheap judgement of what a replay may write over (its pool's steps, buffers
    known let go, members in capture order) checked at every replay against asking every
    buffer: returns the list of (program step, graph) where a held output of the step was
    missed. The simulation does not reuse a pool's freed memory, so a wrong judgement shows
    here, not in the values."""
    written: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # buffer -> step last written
    missed: list = []
    judge, replay = CudaGraphRunner._conflict, CudaGraphRunner._replay

    def judged(self: CudaGraphRunner, cap: Any, every: bool) -> str:
        why = judge(self, cap, every)
        held = [b for m in cap.family.members if m is not cap for b in m.outputs.buffers
                if not b.runners and b not in cap.allowed and written.get(b) == clock.step and b.held()]
        if held and not why:
            missed.append((clock.step, self.graph_id))
        return why

    def replayed(self: CudaGraphRunner, hit: Any, args: list, first: Any = None) -> Any:
        out = replay(self, hit, args, first)
        cap = self.graphs.get(hit.key)
        for b in cap.outputs.buffers if cap is not None else ():
            written[b] = clock.step
        return out

    monkeypatch.setattr(CudaGraphRunner, "_conflict", judged)
    monkeypatch.setattr(CudaGraphRunner, "_replay", replayed)
    return missed


@pytest.mark.parametrize("seed", range(8))
def test_no_replay_writes_over_a_held_output_in_random_training_programs(
        simulated_cuda: None, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Two to four models trained in one pool (a GAN's generator and critic, a teacher and
    its student), each a forward whose output is saved for its backward: each step runs some
    forwards, in one of a few orders or a random one, some reading the last model's output,
    then their backwards in reverse or in a random order, some skipped (the forward's output
    kept instead), some gradients kept to the step's end or into the next. Every result
    must be right when made and stay right while held, but a backward's output held past
    its own runner's next replay (overwritten by design, as reduce-overhead's are).
    Python's collector runs at random points, as a program's allocations would run it."""
    rng = random.Random(seed)
    calls = Generations()
    clock = step_clock.StepClock(calls)
    monkeypatch.setattr(cuda_graphs, "STEP_CLOCK", clock)
    missed = _judged_against_every_buffer(monkeypatch, clock)
    n = rng.randint(2, 4)
    ws = [torch.nn.Parameter(torch.full((4,), 1.0 + k)) for k in range(n)]
    fw = [CudaGraphRunner(Fn(lambda x, w, k=k: x * w + k), f"{k}/0:aot_forward", None, saved_from=0)
          for k in range(n)]
    bw = [CudaGraphRunner(Fn(lambda h, g, k=k: h * g + k), f"{k}/0:aot_backward", None) for k in range(n)]
    orders = [rng.sample(range(n), rng.randint(1, n)) for _ in range(3)]
    was_enabled = gc.isenabled()
    gc.disable()  # collections where the seed puts them
    kept: list = []  # (tensor, its value, "fw" or "bw", model, step)
    try:
        for step in range(24):
            calls.bump()
            order = rng.choice(orders) if rng.random() < 0.8 else rng.sample(range(n), rng.randint(1, n))
            made, held, backwards = [], [], set()
            last = None
            with torch.no_grad():  # as AOTAutograd runs compiled graphs
                for k in order:
                    x = last.clone() if last is not None and rng.random() < 0.3 else torch.full((4,), float(step))
                    want = x * ws[k] + k
                    last = fw[k]([x, ws[k]])[0]
                    assert torch.equal(last, want), (step, "forward", k)
                    made.append((k, last, want))
                    if rng.random() < 0.2:
                        gc.collect(1)
                for k, h, want in list(reversed(made)) if rng.random() < 0.7 else rng.sample(made, len(made)):
                    if rng.random() < 0.1:
                        held.append((h, want, "fw", k, step))  # no backward this step: its input held
                        continue
                    out = bw[k]([h, torch.full((4,), 2.0)])[0]
                    backwards.add(k)
                    assert torch.equal(out, want * 2 + k), (step, "backward", k)
                    if rng.random() < 0.3:
                        held.append((out, want * 2 + k, "bw", k, step))
                    if rng.random() < 0.2:
                        gc.collect(1)
                del made, last
            for t, want, stage, k, at in held + kept:
                if not (stage == "bw" and at != step and k in backwards):
                    assert torch.equal(t, want), (step, "held", stage, k, at)
            kept = held if rng.random() < 0.3 else []
            del held
            if rng.random() < 0.3:
                gc.collect()
        assert not missed, missed
    finally:
        if was_enabled:
            gc.enable()
