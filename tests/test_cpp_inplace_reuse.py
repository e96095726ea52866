"""The C++ target writes a pointwise kernel's output over an input that dies at
that kernel (plan.py `_reuse_dying_inputs`) only when every element of the
input is loaded before the output's store: in a kernel with several outputs,
an output stored before the body loads the input is no candidate."""

from __future__ import annotations

import torch

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


def _mask_then_divide(x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # `a` (an extern's result) dies in the kernel computing `m.float()` and `a / ...`.
    # The kernel stores `m.float()` first and loads `a` afterwards: storing it in
    # `a`'s buffer would make the division read the mask instead of `a`
    # (scatter_reduce(prod)'s backward has this shape: its src gradient was off by 3).
    a = torch.gather(x, 0, idx)
    m = y == 0
    counts = torch.zeros_like(x).scatter_add(0, idx, m.float())
    return counts, a / torch.where(m, torch.ones_like(y), y)


def test_output_stored_before_an_input_is_loaded_does_not_take_its_buffer() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, y = torch.randn(10, 5), torch.randn(5, 5)
    y[0, 0] = 0.0
    idx = torch.randint(0, 10, (5, 5))
    compiled = torch.compile(_mask_then_divide, backend="fuselens", options={"target": "cpp", "fallback_on_error": False})
    for got, want in zip(compiled(x, y, idx), _mask_then_divide(x, y, idx)):
        torch.testing.assert_close(got, want)
