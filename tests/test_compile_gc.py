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
    fuselens.compiler.register()
    torch._dynamo.reset()
    w = torch.randn(8, 8, requires_grad=True)
    torch.compile(lambda x: (x @ w).relu().sum(), backend="fuselens")(torch.randn(4, 8)).backward()
    return seen


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
