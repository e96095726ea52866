"""Whole models through the compiler backend, compared to eager.

The backend under test is `fuselens` unless FUSELENS_TEST_BACKEND names
another (`eager`, `aot_eager`, `inductor`): the same tests then check the
harness itself against a backend that is known to be right.

Tolerances: float32 with library matmuls on both sides; fused reductions
(LayerNorm, BatchNorm, softmax) accumulate in a different order than ATen, so
values agree to ~1e-6 relative; 1e-4 leaves room for that across a block and
its backward without hiding a wrong index or a missing term (those are O(1)).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.opinfo_harness import CountingBackend, account_nodes  # noqa: E402
from models import MLP, BasicBlock, GPT2Block, make_train_step, seeded  # noqa: E402

from fuselens import sink  # noqa: E402

BACKEND = os.environ.get("FUSELENS_TEST_BACKEND", "fuselens")
if BACKEND == "fuselens":
    import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)

RTOL, ATOL = 1e-4, 1e-4


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compile_counting(fn: Any, **kwargs: Any) -> tuple[Any, CountingBackend]:
    """torch.compile through the backend under test, counting the graphs it gets."""
    counting = CountingBackend(BACKEND)
    return torch.compile(fn, backend=counting, **kwargs), counting


def assert_generated_kernels(events: list[Any]) -> None:
    """With the fuselens backend, a model must not silently run all-extern:
    some ATen nodes must land in generated kernels."""
    if BACKEND != "fuselens":
        return
    acc = account_nodes(events)
    assert acc.graph_fallbacks == 0, f"graphs fell back to eager: {acc.fallback_reasons}"
    assert acc.lowered > 0, f"no node in a generated kernel (extern: {acc.extern_ops})"


@pytest.mark.parametrize("attention", ["sdpa", "explicit_softmax"])
def test_gpt2_block_inference_matches_eager(attention: str) -> None:
    model = seeded(lambda: GPT2Block(64, 4, use_sdpa=attention == "sdpa")).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        expected = model(x)
        compiled, counting = compile_counting(model)
        with sink.collect() as events:
            actual = compiled(x)
    assert counting.graphs == 1
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    assert_generated_kernels(events)


def test_gpt2_block_backward_gradients_match_eager() -> None:
    model = seeded(lambda: GPT2Block(64, 4, use_sdpa=False))
    cmodel = copy.deepcopy(model)
    x = torch.randn(2, 16, 64)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    model(xe).square().mean().backward()
    compiled, _ = compile_counting(cmodel)
    with sink.collect() as events:
        compiled(xc).square().mean().backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=RTOL, atol=ATOL)
    for (name, p), (_, pc) in zip(model.named_parameters(), cmodel.named_parameters()):
        torch.testing.assert_close(pc.grad, p.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"grad of {name}: {m}")
    assert_generated_kernels(events)


def test_gpt2_block_dynamic_seq_len_and_batch_compile_once() -> None:
    model = seeded(lambda: GPT2Block(64, 4, use_sdpa=False)).eval()
    compiled, counting = compile_counting(model, dynamic=True)
    with torch.no_grad():
        # Sizes avoid 1: Dynamo specialises size-1 dims (broadcasting semantics).
        for batch, seq in [(2, 8), (3, 12), (4, 16), (2, 24), (2, 8)]:
            x = torch.randn(batch, seq, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL, msg=lambda m: f"{batch}x{seq}: {m}")
    assert counting.graphs == 1, f"recompiled per size: {counting.graphs} graphs for 4 sizes"


def test_resnet_basic_block_eval_matches_eager() -> None:
    model = seeded(lambda: BasicBlock(16)).eval()
    x = torch.randn(2, 16, 14, 14)
    with torch.no_grad():
        expected = model(x)
        compiled, _ = compile_counting(model)
        with sink.collect() as events:
            actual = compiled(x)
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)
    assert_generated_kernels(events)


def test_resnet_basic_block_train_matches_eager_with_grads_and_running_stats() -> None:
    model = seeded(lambda: BasicBlock(16)).train()
    cmodel = copy.deepcopy(model)
    x = torch.randn(4, 16, 10, 10)
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_e = model(xe)
    out_e.sum().backward()
    compiled, _ = compile_counting(cmodel)
    with sink.collect() as events:
        out_c = compiled(xc)
        out_c.sum().backward()
    torch.testing.assert_close(out_c, out_e, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=RTOL, atol=ATOL)
    for (name, p), (_, pc) in zip(model.named_parameters(), cmodel.named_parameters()):
        torch.testing.assert_close(pc.grad, p.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"grad of {name}: {m}")
    # Train-mode BatchNorm mutates its running statistics: the compiled graph
    # must write them back exactly like eager.
    for (name, b), (_, bc) in zip(model.named_buffers(), cmodel.named_buffers()):
        torch.testing.assert_close(bc, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"buffer {name}: {m}")
    assert_generated_kernels(events)


@pytest.mark.parametrize("optim", ["sgd_momentum", "adam"])
def test_mlp_training_steps_match_eager_losses_grads_and_params(optim: str) -> None:
    def make(model: torch.nn.Module) -> torch.optim.Optimizer:
        if optim == "adam":
            return torch.optim.Adam(model.parameters(), lr=1e-2)
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model = seeded(lambda: MLP(32, 64, 10))
    cmodel = copy.deepcopy(model)
    step_e = make_train_step(model, make(model))
    step_c, counting = compile_counting(make_train_step(cmodel, make(cmodel)))
    torch.manual_seed(1)
    batches = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(3)]
    with sink.collect() as events:
        for i, (x, y) in enumerate(batches):
            loss_e, loss_c = step_e(x, y), step_c(x, y)
            torch.testing.assert_close(loss_c, loss_e, rtol=RTOL, atol=ATOL, msg=lambda m: f"loss of step {i}: {m}")
    assert counting.graphs >= 1
    for (name, p), (_, pc) in zip(model.named_parameters(), cmodel.named_parameters()):
        torch.testing.assert_close(pc.grad, p.grad, rtol=RTOL, atol=ATOL, msg=lambda m: f"grad of {name}: {m}")
        torch.testing.assert_close(pc, p, rtol=RTOL, atol=ATOL, msg=lambda m: f"updated {name}: {m}")
    assert_generated_kernels(events)


def test_training_step_never_has_dynamo_trace_compiler_code() -> None:
    """The backward graph is compiled lazily inside `loss.backward()`, which
    runs in user code under Dynamo's frame hook: the backend's own Python
    (compiler and runtime) must be invisible to Dynamo (tests/compiler_failures.md F1)."""
    from torch._dynamo import utils

    if hasattr(utils, "clear_compilation_metrics"):
        utils.clear_compilation_metrics()
    model = seeded(lambda: torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor) -> None:
        opt.zero_grad()
        model(x).relu().sum().backward()
        opt.step()

    compiled, _ = compile_counting(step)
    compiled(torch.randn(4, 8))
    compiled(torch.randn(4, 8))
    import fuselens

    package = str(Path(fuselens.__file__).resolve().parent)
    traced = sorted({f"{m.co_filename}:{m.co_name}" for m in utils.get_compilation_metrics()
                     if m.co_filename and m.co_filename.startswith(package)})
    assert not traced, f"Dynamo traced fuselens frames: {traced}"
