"""What the compiler tests share: a fresh Dynamo around each test, a compile checked
against eager, the C++ kernels among a compile's events, and a stand-in launcher for
hand-built plans."""

from __future__ import annotations

import pytest
import torch

from fuselens import sink
from fuselens.events import ErrorEntry, Kernel


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run(fn, *args, **compile_kw):
    """Compile fn with fuselens, check it matches eager; returns the events."""
    with sink.collect() as events:
        out = torch.compile(fn, backend="fuselens", **compile_kw)(*args)
    torch.testing.assert_close(out, fn(*args), equal_nan=True)
    errors = [e for e in events if isinstance(e, ErrorEntry) and e.kind in ("compile", "internal")]
    assert not errors, errors[0].message
    return events


def cpp_kernels(events):
    return [e for e in events if isinstance(e, Kernel) and e.kind == "cpp"]


class AddLauncher:
    """Stands in for a Triton launcher in hand-built plans: out = a + b (takes tensors,
    like the real one; no direct launch path, as in Triton's interpreter)."""

    takes_tensors = True

    def __call__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        torch.add(a, b, out=out)

    def fast_launcher(self) -> None:
        return None
