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
