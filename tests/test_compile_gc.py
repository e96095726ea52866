"""The garbage collector during a compile (compiler/compile_gc.py): objects older than the
compile are frozen while it runs and collectable again after it; a program's own frozen
objects stay frozen."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import fuselens.compiler
from fuselens.compiler import entry


def _freeze_counts_while_compiling(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = entry._compile_pipeline

    def watching(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_freeze_count())
        return real(*args, **kwargs)

    monkeypatch.setattr(entry, "_compile_pipeline", watching)
    _compile_a_training_step()
    return seen


def _compile_a_training_step() -> None:
    """A fresh fuselens compile of a small step, forward and backward."""
    fuselens.compiler.register()
    torch._dynamo.reset()
    w = torch.randn(8, 8, requires_grad=True)
    torch.compile(lambda x: (x @ w).relu().sum(), backend="fuselens")(torch.randn(4, 8)).backward()


def test_a_compile_freezes_older_objects_and_leaves_them_collectable_after(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gc.get_freeze_count() == 0
    seen = _freeze_counts_while_compiling(monkeypatch)
    assert len(seen) == 2 and all(n > 1000 for n in seen)  # forward and backward, each with the heap frozen
    assert gc.get_freeze_count() == 0


def test_objects_a_program_froze_itself_stay_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        seen = _freeze_counts_while_compiling(monkeypatch)
        # the compile froze nothing more (frozen objects only die) and unfroze nothing
        assert seen and max(seen) <= frozen and gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()


def _collector_as_dynamo_starts(backend: str) -> list[tuple[int, tuple]]:
    """The freeze count and thresholds a Dynamo start callback registered after ours sees."""
    seen: list[tuple[int, tuple]] = []

    def watch(args: Any) -> None:
        seen.append((gc.get_freeze_count(), gc.get_threshold()))

    fuselens.compiler.register()
    torch._dynamo.reset()
    torch._dynamo.callback_handler.register_start_callback(watch)
    try:
        torch.compile(lambda x: (x * 2).sin().sum(), backend=backend)(torch.randn(4, 8))
    finally:
        torch._dynamo.callback_handler.remove_start_callback(watch)
    return seen


def test_dynamo_traces_a_fuselens_frame_with_old_objects_frozen_and_no_full_passes() -> None:
    before = gc.get_threshold()
    seen = _collector_as_dynamo_starts("fuselens")
    assert seen and seen[0][0] > 1000
    assert seen[0][1][2] > before[2] * 10  # full passes wait for the compile's end
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_a_frame_compiled_for_another_backend_keeps_the_collector_as_it_is() -> None:
    before = gc.get_threshold()
    seen = _collector_as_dynamo_starts("eager")
    assert seen == [(0, before)]


STEP_WITH_BACKWARD_INSIDE = """
import torch
import fuselens.compiler
fuselens.compiler.register()
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

@torch.compile(backend="fuselens")
def step(x):
    loss = model(x).square().mean()
    loss.backward()  # a graph break: the backward is compiled lazily, under the resumed frame's hook
    return loss

step(torch.randn(4, 8))
print("STEP-DONE")
"""


def test_a_backward_compiled_inside_a_compiled_step_runs_our_callbacks_without_waiting_for_itself() -> None:
    """Our Dynamo callbacks run when the backward compiles, under the hook of the step it
    resumes: traced by Dynamo, they started a compile inside the callback handler's lock,
    which then waited for itself (a hang, before they were hidden from Dynamo)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", STEP_WITH_BACKWARD_INSIDE], capture_output=True, text=True, timeout=300)
    assert "STEP-DONE" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_a_compile_runs_only_young_generation_passes_and_promotes_nothing_into_the_oldest() -> None:
    """The compile's objects would otherwise be counted as new long-lived objects and
    bring a pass over the whole process right after it (0.4-0.7 s on the H200)."""
    from fuselens.compiler import compile_gc

    during: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start" and compile_gc._depth > 0:
            during.append(info["generation"])

    gc.callbacks.append(watch)
    try:
        _compile_a_training_step()
    finally:
        gc.callbacks.remove(watch)
    assert during and set(during) == {0}  # young passes still free the compile's short-lived cycles


class _Cycle:
    pass


@pytest.fixture
def only_our_full_passes(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Python runs no full pass of its own, and an earlier test's passes and compiles of ours
    do not count in this test's share."""
    from fuselens.compiler import compile_gc

    monkeypatch.setattr(compile_gc, "_spent", 0.0)
    monkeypatch.setattr(compile_gc, "_last", 0.0)
    monkeypatch.setattr(compile_gc, "_since", -1.0)  # the program's first compile is this test's
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1 << 30)
    yield compile_gc
    gc.set_threshold(*thresholds)


def test_garbage_waiting_in_the_young_generations_is_freed_before_a_compile_freezes_it() -> None:
    """A freeze moves what exists, garbage included, into the permanent generation and its
    end into the oldest, where only a full pass frees it. Between two of a step's compiles
    (a graph break: the resumed frame compiles after the eager part ran) that garbage can
    hold the step's tensors."""
    fuselens.compiler.register()
    torch._dynamo.reset()
    refs: list = []

    @torch._dynamo.disable
    def leave_a_cycle(x: torch.Tensor) -> torch.Tensor:
        c = _Cycle()
        c.me, c.t = c, x * 2
        refs.append(__import__("weakref").ref(c.t))
        gc.collect(0)  # the cycle, still alive, survives a young pass: garbage in the middle generation
        return x

    def f(x: torch.Tensor) -> torch.Tensor:
        x = leave_a_cycle(x + 1)  # a graph break: the rest compiles after this returns
        return (x * 3).sum()

    torch.compile(f, backend="fuselens")(torch.randn(64, 64))
    assert refs and refs[0]() is None  # no collection of ours: the compile's start freed it


def test_a_full_pass_after_compiles_frees_old_garbage_that_holds_a_step_s_tensors(only_our_full_passes: Any) -> None:
    """Garbage in the oldest generation waits for a full pass, which the compile's freeze
    holds back; Dynamo's trace of a graph break leaves such a cycle holding the step's frame
    (BART training on the H200 kept a step's 785 MB of logits through every later step).
    The graph's next call frees it, and a run of later calls does not pay for that again."""
    fuselens.compiler.register()
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x * 3).sin().sum(), backend="fuselens")
    x = torch.randn(64, 64)
    c = _Cycle()
    c.me, c.t = c, torch.randn(256, 256)
    ref = __import__("weakref").ref(c.t)
    gc.collect()  # the cycle, still reachable, now in the oldest generation
    del c
    f(x)  # compiles and runs once: the step that compiled
    assert ref() is not None  # only a full pass frees it
    full = gc.get_stats()[2]["collections"]
    f(x)  # the next step
    assert ref() is None
    assert gc.get_stats()[2]["collections"] == full + 1
    for _ in range(3):
        f(x)
    assert gc.get_stats()[2]["collections"] == full + 1  # once per run of compiles



def test_a_graph_called_again_while_the_step_still_compiles_waits_for_the_compiles_to_end(
        only_our_full_passes: Any) -> None:
    """A graph called twice in the first step (BART's mask graph, for its encoder and its
    decoder) with another graph compiled between its calls: no pass at its second call, in
    the middle of the step's compiles, but one at the first call after them, and no more."""
    fuselens.compiler.register()
    torch._dynamo.reset()
    x = torch.randn(8)
    mask = torch.compile(lambda x: x.cos() + 1, backend="fuselens")
    layer = torch.compile(lambda x: x.sin() * 2, backend="fuselens")
    full = gc.get_stats()[2]["collections"]
    mask(x)  # compiles
    layer(x)  # compiles: the step goes on compiling
    mask(x)
    assert gc.get_stats()[2]["collections"] == full
    layer(x)  # no compile since its last call: the step's compiles have ended
    assert gc.get_stats()[2]["collections"] == full + 1
    for _ in range(3):
        mask(x)
        layer(x)
    assert gc.get_stats()[2]["collections"] == full + 1

def test_a_pass_past_the_programs_share_is_skipped_not_run_later_in_the_steady_state(
        only_our_full_passes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program compiling again and again (new shapes, new functions) pays at most a tenth of
    its time since its first compile for these passes. A pass that would take it past that
    share is skipped: run later, it stalled a step of the steady state (BART training on the
    H200: 0.55 s, a hundred steps after the compiles). The next compiles ask again."""
    compile_gc = only_our_full_passes
    fuselens.compiler.register()
    torch._dynamo.reset()
    x = torch.randn(8)
    f = torch.compile(lambda x: x.cos() + 1, backend="fuselens")
    f(x)
    full = gc.get_stats()[2]["collections"]
    f(x)  # the pass after the first compile
    assert gc.get_stats()[2]["collections"] == full + 1 and compile_gc._spent > 0
    # passes as long as this test's compiles (a process of many objects): the next one would
    # take the program past its share
    monkeypatch.setattr(compile_gc, "_last", __import__("time").monotonic() - compile_gc._since)
    g = torch.compile(lambda x: x.sin() * 2, backend="fuselens")
    g(x)
    g(x)  # past the share: skipped
    assert gc.get_stats()[2]["collections"] == full + 1 and not compile_gc._compiled
    monkeypatch.setattr(compile_gc, "_since", compile_gc._since - 1e3)  # the program has run longer since
    for _ in range(3):  # the steady state: no compile since, no pass
        g(x)
        f(x)
    assert gc.get_stats()[2]["collections"] == full + 1
    h = torch.compile(lambda x: x.tan() - 1, backend="fuselens")
    h(x)
    h(x)  # a new compile, within the share now: its pass runs
    assert gc.get_stats()[2]["collections"] == full + 2 and not compile_gc._compiled
