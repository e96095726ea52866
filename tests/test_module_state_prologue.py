"""An inference graph's work on parameters and buffers alone runs once, and again whenever
one of them changes (compiler/module_state_prologue.py), on the C++ target with g++."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fuselens.compiler
from fuselens import sink
from fuselens.compiler.module_state_prologue import PrologueRunner
from fuselens.events import FusionDecision


class ConvBlock(torch.nn.Module):
    """A ResNet stem: its 3x3 weight goes channels-last, its batch norm's scale is per channel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.normal_()
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.normal_()
            self.bn.bias.normal_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


@pytest.fixture
def prologue_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times each call's prologue computed its values."""
    runs: list[int] = []
    real = PrologueRunner._compute

    def counted(self: PrologueRunner, state: list) -> Any:
        runs.append(1)
        return real(self, state)

    monkeypatch.setattr(PrologueRunner, "_compute", counted)
    fuselens.compiler.register()
    torch._dynamo.reset()
    return runs


def _compiled(model: torch.nn.Module, **options: Any) -> Any:
    return torch.compile(model, backend="fuselens", options=options or None)


def test_a_conv_weight_and_batch_norm_scale_are_computed_once_across_calls(prologue_runs: list[int]) -> None:
    torch.manual_seed(0)
    model = ConvBlock().eval()
    x = torch.randn(2, 4, 10, 10)
    f = _compiled(model)
    with torch.no_grad(), sink.collect() as events:
        for _ in range(4):
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(prologue_runs) == 1
    cut = [e for e in events if isinstance(e, FusionDecision) and e.rule == "module-state-prologue"]
    assert cut and all("computed once from the module's parameters and buffers" in e.reason for e in cut)


@pytest.mark.parametrize("change", ["weight updated in place", "running variance updated in place",
                                    "weight given new memory", "state dict loaded"])
def test_a_changed_parameter_or_buffer_is_seen_at_the_next_call(prologue_runs: list[int], change: str) -> None:
    torch.manual_seed(0)
    model = ConvBlock().eval()
    x = torch.randn(2, 4, 10, 10)
    f = _compiled(model)
    with torch.no_grad():
        f(x)
        if change == "weight updated in place":
            model.conv.weight.mul_(-0.5)
        elif change == "running variance updated in place":
            model.bn.running_var.mul_(3.0)
        elif change == "weight given new memory":
            model.conv.weight.data = torch.randn_like(model.conv.weight)
        else:
            model.load_state_dict(ConvBlock().state_dict())
        torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(prologue_runs) == 2


def test_parameters_made_under_inference_mode_are_worked_on_at_every_call(prologue_runs: list[int]) -> None:
    """Inference tensors keep no version counter: nothing tells a change, so nothing is kept."""
    torch.manual_seed(0)
    with torch.inference_mode():
        model = ConvBlock().eval()
        x = torch.randn(2, 4, 10, 10)
        f = _compiled(model)
        f(x)
        model.conv.weight.mul_(2.0)
        torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-5)
    assert len(prologue_runs) == 2


class ReturnsScaledWeight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = self.w.exp()
        return x * scale, scale * 2


def test_a_value_the_graph_returns_is_not_a_cached_tensor_the_caller_could_change(prologue_runs: list[int]) -> None:
    torch.manual_seed(0)
    model = ReturnsScaledWeight()
    x = torch.randn(4, 16)
    f = _compiled(model)
    with torch.no_grad():
        _, returned = f(x)
        returned.zero_()  # the caller's own tensor
        y, again = f(x)
        torch.testing.assert_close(y, x * model.w.exp())
        torch.testing.assert_close(again, model.w.exp() * 2)


class Broadcasts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = self.w.expand(256, 64).contiguous() + 1  # 256x the parameter's memory
        return x + big


def test_work_whose_result_outgrows_the_state_it_reads_stays_in_the_graph(prologue_runs: list[int]) -> None:
    torch.manual_seed(0)
    model = Broadcasts()
    x = torch.randn(256, 64)
    with torch.no_grad(), sink.collect() as events:
        torch.testing.assert_close(_compiled(model)(x), model(x))
    cut = [e for e in events if isinstance(e, FusionDecision) and e.rule == "module-state-prologue"]
    assert not cut and not prologue_runs


class CountsCalls(torch.nn.Module):
    """A buffer the forward updates (a call counter, a running statistic) is not module state
    to keep: every call changes it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(8))
        self.w = torch.nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * (self.calls * self.w.sigmoid())


def test_a_buffer_the_graph_updates_is_read_at_each_call_and_the_rest_still_computed_once(
        prologue_runs: list[int]) -> None:
    torch.manual_seed(0)
    model, eager = CountsCalls(), CountsCalls()
    eager.load_state_dict(model.state_dict())
    x = torch.randn(4, 8)
    f = _compiled(model)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), eager(x))
    assert len(prologue_runs) == 1  # the weight's sigmoid; with the counter in it, every call


def test_training_graphs_and_the_option_off_keep_the_work_in_the_graph(prologue_runs: list[int]) -> None:
    torch.manual_seed(0)
    model = ConvBlock().eval()
    x = torch.randn(2, 4, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(_compiled(model, module_state_once="never")(x), model(x), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
    model.train()
    _compiled(model)(x).sum().backward()
    assert not prologue_runs
