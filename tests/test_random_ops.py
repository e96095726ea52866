"""Random ops drawn inside the kernels (compiler/random_ops.py): the same Philox
numbers on the C++ target, in the Triton interpreter (subprocess) and in the torch
reference; a dropout's forward and backward read one mask; seeds come from torch's
generator at every call; option fallback_random keeps eager's numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from triton_worker import interpreted_worker_records

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from fuselens import sink
from fuselens.compiler import random_ops
from fuselens.events import ErrorEntry, FusionDecision, Kernel


def _draws(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.rand_like(x), torch.randn_like(x) * 2 + x, torch.nn.functional.dropout(x, 0.3)


def _compiled_draws(opts: dict) -> dict:
    """_draws compiled after torch.manual_seed(1), and the reference numbers of the seeds drawn so."""
    x = torch.arange(3 * 5 * 7, dtype=torch.float32).view(3, 5, 7) / 100
    f = torch.compile(_draws, backend="fuselens", options=opts)
    torch.manual_seed(1)
    u, n, d = f(x)
    torch.manual_seed(1)
    seeds = random_ops.draw_seeds(3, torch.device("cpu"))
    i = torch.arange(x.numel())
    return {"u": u.tolist(), "n": n.tolist(), "d": d.tolist(),
            "ref_u": random_ops.philox_uniform(seeds[0], i).view_as(x).tolist(),
            "ref_n": (random_ops.philox_normal(seeds[1], i).view_as(x) * 2 + x).tolist()}


def _check_draws(r: dict) -> None:
    assert r["u"] == r["ref_u"]  # bit for bit
    assert torch.allclose(torch.tensor(r["n"]), torch.tensor(r["ref_n"]), atol=1e-5)


def test_cpp_kernels_draw_the_reference_philox_numbers_bit_for_bit() -> None:
    torch._dynamo.reset()
    _check_draws(_compiled_draws({"target": "cpp", "fallback_on_error": False}))


def test_triton_kernels_draw_the_same_numbers_as_the_cpp_ones(tmp_path: Path) -> None:
    torch._dynamo.reset()
    cpp = _compiled_draws({"target": "cpp", "fallback_on_error": False})
    triton = interpreted_worker_records(__file__, tmp_path / "out.json", 600, "the random-ops worker")
    _check_draws(triton)
    assert triton["d"] == cpp["d"]  # the same dropout mask from the same seed on both targets


def test_philox_reference_is_uniform_and_normal() -> None:
    u = random_ops.philox_uniform(torch.tensor(12345), torch.arange(200_000))
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert float((u < 0.1).float().mean()) == pytest.approx(0.1, abs=0.005)
    n = random_ops.philox_normal(torch.tensor(7), torch.arange(200_000))
    assert abs(float(n.mean())) < 0.01 and float(n.std()) == pytest.approx(1.0, abs=0.01)
    # another seed, other numbers; offsets past 2^32 use the counter's high word
    assert not torch.equal(u, random_ops.philox_uniform(torch.tensor(12346), torch.arange(200_000)))
    assert not torch.equal(random_ops.philox_uniform(torch.tensor(1), torch.tensor([5])),
                           random_ops.philox_uniform(torch.tensor(1), torch.tensor([5 + 2**32])))


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.nn.functional.gelu(self.lin(x)))


def test_dropout_forward_and_backward_read_one_mask_fused_with_its_neighbours() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(512, 32, requires_grad=True)
    with sink.collect() as events:
        y = torch.compile(block, backend="fuselens", options={"fallback_on_error": False})(x)
        y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    assert float(kept.float().mean()) == pytest.approx(0.75, abs=0.02)
    h = torch.nn.functional.gelu(block.lin(x)).detach()
    assert torch.allclose(y.detach()[kept], h[kept] / 0.75, rtol=1e-5, atol=1e-6)
    # the backward scales the gradient by the forward's mask: d y / d h = mask / 0.75
    want = torch.autograd.grad(torch.nn.functional.gelu(block.lin(x)), x, kept.float() / 0.75)[0]
    assert torch.allclose(x.grad, want, rtol=1e-5, atol=1e-6)
    assert not [e for e in events if isinstance(e, ErrorEntry)]
    names = [e.name for e in events if isinstance(e, Kernel)]
    # GELU, the draw, the mask and the scaling in one kernel; the seeds and the matmul are library calls
    forward = [n for n in names if "random" in n and not n.startswith("extern")]
    assert len(forward) == 1 and "erf" in forward[0] and "gt" in forward[0], names
    assert any(e.rule == "random-in-kernel" for e in events if isinstance(e, FusionDecision))


def test_compiled_dropout_repeats_under_manual_seed_and_draws_anew_each_call() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.5), backend="fuselens")
    x = torch.ones(4096)
    torch.manual_seed(5)
    a, b = f(x), f(x)
    torch.manual_seed(5)
    assert torch.equal(f(x), a)
    assert not torch.equal(a, b)


def test_dropout_with_dynamic_sizes_and_bernoulli_are_lowered_without_fallbacks() -> None:
    """torchvision's stochastic depth fills `torch.empty` with bernoulli_; dropout2d too."""
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keep = torch.empty(x.shape[0], 1, 1, 1).bernoulli_(0.8)
        return torch.nn.functional.dropout2d(x, 0.5), x * keep, torch.nn.functional.dropout(x, 0.2)

    cf = torch.compile(f, backend="fuselens", dynamic=True, options={"fallback_on_error": False})
    torch.manual_seed(0)
    for n in (2000, 3000):
        x = torch.ones(n, 4, 3, 3)
        with sink.collect() as events:
            channels, depth, plain = cf(x)
        assert not [e for e in events if isinstance(e, ErrorEntry)]
        per_channel = channels.sum((2, 3))
        assert set(per_channel.unique().tolist()) <= {0.0, 18.0}  # whole channels dropped or scaled by 2
        assert float((per_channel != 0).float().mean()) == pytest.approx(0.5, abs=0.05)
        assert float((depth.sum((1, 2, 3)) != 0).float().mean()) == pytest.approx(0.8, abs=0.04)
        assert float((plain != 0).float().mean()) == pytest.approx(0.8, abs=0.02)


def test_float64_random_stays_in_atens_generator() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda x: x + torch.rand_like(x), backend="fuselens")
    x = torch.zeros(64, dtype=torch.float64)
    torch.manual_seed(2)
    got = f(x)
    torch.manual_seed(2)
    assert torch.equal(got, torch.rand_like(x))


def test_option_fallback_random_gives_eagers_dropout_mask() -> None:
    torch._dynamo.reset()

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(torch.sin(x), 0.3) * 2

    x = torch.randn(64, 33, requires_grad=True)
    with sink.collect() as events:
        torch.manual_seed(3)
        mine = torch.compile(f, backend="fuselens", options={"fallback_random": True})(x)
    mine.sum().backward()
    grad, x.grad = x.grad, None
    torch.manual_seed(3)
    want = f(x)
    want.sum().backward()
    assert torch.equal(mine == 0, want == 0)
    assert torch.allclose(mine, want, rtol=1e-6, atol=1e-6) and torch.allclose(grad, x.grad)
    assert not [e for e in events if isinstance(e, ErrorEntry)]  # kept in ATen on purpose: no finding


if __name__ == "__main__":  # pragma: no cover - the worker, under TRITON_INTERPRET=1
    from triton_worker import worker_main

    worker_main(_compiled_draws, "fl_random_")
