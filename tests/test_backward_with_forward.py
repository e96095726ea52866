"""Option `backward_with_forward` (compiler/entry.py): a training graph's backward is
compiled right after its forward, before the forward first runs, so that on CUDA the
kernels of each graph compile in the workers while the other's passes run. The option
takes effect on Triton-on-CUDA graphs only; here (no GPU in CI) AOTAutograd's non-lazy
lowering is asked for directly, on the C++ target, to check the order and the results."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from fuselens.compiler import entry


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _stages_while_training(monkeypatch: pytest.MonkeyPatch, early: bool) -> tuple[list[str], list[str], torch.Tensor]:
    stages: list[str] = []
    real_compile = entry.compile_graph

    def watching(gm: Any, ins: Any, *, stage: str, **kw: Any) -> Any:
        stages.append(stage)
        return real_compile(gm, ins, stage=stage, **kw)

    real_aot = entry._aot_compile
    monkeypatch.setattr(entry, "compile_graph", watching)
    monkeypatch.setattr(entry, "_aot_compile", lambda *a, **k: real_aot(*a, **{**k, "backward_with_forward": early}))
    w = torch.randn(16, 16, requires_grad=True)
    fn = torch.compile(lambda x: torch.nn.functional.gelu(x @ w).sum(), backend="fuselens")
    loss = fn(torch.randn(8, 16))
    after_forward = list(stages)
    loss.backward()
    return after_forward, stages, w.grad


def test_the_backward_is_compiled_before_the_forward_runs(monkeypatch):
    after_forward, stages, _ = _stages_while_training(monkeypatch, early=True)
    assert after_forward == ["aot_forward", "aot_backward"] and stages == after_forward  # compiled once


def test_without_it_the_backward_is_compiled_at_the_first_backward(monkeypatch):
    after_forward, stages, _ = _stages_while_training(monkeypatch, early=False)
    assert after_forward == ["aot_forward"] and stages == ["aot_forward", "aot_backward"]


def test_gradients_with_the_backward_compiled_early_equal_eagers(monkeypatch):
    torch.manual_seed(0)
    _, _, grad = _stages_while_training(monkeypatch, early=True)
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    torch.nn.functional.gelu(torch.randn(8, 16) @ w).sum().backward()
    torch.testing.assert_close(grad, w.grad, rtol=1e-4, atol=1e-5)


def test_the_option_asks_for_it_on_triton_cuda_graphs_only(monkeypatch):
    asked: list[bool] = []
    real_aot = entry._aot_compile
    monkeypatch.setattr(entry, "_aot_compile", lambda *a, **k: asked.append(k["backward_with_forward"]) or real_aot(*a, **k))
    w = torch.randn(4, 4, requires_grad=True)
    torch.compile(lambda x: (x @ w).sum(), backend="fuselens")(torch.randn(2, 4)).backward()
    assert asked == [False]  # a CPU graph: nothing compiles in the background to overlap
