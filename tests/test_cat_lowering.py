"""A cat is computed in its readers' kernels up to MAX_POINTWISE_CAT_PARTS parts;
past that, ATen's cat copies each part once and the readers load its result (a
library call chosen, reported as none of the fallbacks). C++ target, this CPU."""

from __future__ import annotations

import pytest
import torch

import fuselens.compiler  # noqa: F401
from fuselens import sink
from fuselens.compiler.lowering.views import MAX_POINTWISE_CAT_PARTS
from fuselens.events import ErrorEntry, Kernel


def _compile(parts: int) -> tuple[list, torch.Tensor, torch.Tensor]:
    torch._dynamo.reset()
    xs = [torch.randn(2, 3 + i, 4) for i in range(parts)]

    def f(*xs: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.cat([x * 2 for x in xs], 1)) + 1

    with sink.collect() as events:
        out = torch.compile(f, backend="fuselens", options={"fallback_on_error": False})(*xs)
    return events, out, f(*xs)


@pytest.mark.parametrize("parts", [MAX_POINTWISE_CAT_PARTS, MAX_POINTWISE_CAT_PARTS + 1])
def test_a_cat_past_the_part_limit_runs_as_one_library_call_and_below_it_in_the_kernels(parts: int) -> None:
    events, out, ref = _compile(parts)
    torch.testing.assert_close(out, ref)
    externs = [k for k in events if isinstance(k, Kernel) and k.kind == "extern"]
    if parts > MAX_POINTWISE_CAT_PARTS:
        assert len(externs) == 1 and externs[0].ops == ["aten.cat.default"], externs
    else:
        assert externs == []
    assert not [e for e in events if isinstance(e, ErrorEntry)]  # chosen, not a fallback: no finding
