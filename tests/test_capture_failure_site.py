"""A capture CUDA refuses is reported at the kernel or library call it stopped at, with
that step's ATen ops and the user's line it computes: the generated wrapper maps a
traceback to its plan step (runtime/wrapper_codegen.py), and the plan keeps each step's
ops and stack trace (runtime/plan.py). No GPU here: the refusal is stood in for by a step
of a real compiled CPU graph that raises the error a capture raises; the wrapper, the plan
and the finding are the code the GPU runs."""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import fuselens.compiler  # noqa: F401  (registers backend="fuselens")
from fuselens.compiler.runtime import capture_failure, wrapper_codegen

REFUSAL = "CUDA error: operation not permitted when stream is capturing"


def _model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = torch.relu(x) * 2
    return y @ w


@pytest.fixture()
def wrapper(monkeypatch):
    torch._dynamo.reset()
    made = []
    wrap = wrapper_codegen.wrap

    def recording(runner, fast=True):
        w = wrap(runner, fast)
        made.append(w)
        return w

    monkeypatch.setattr(wrapper_codegen, "wrap", recording)
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    torch.compile(_model, backend="fuselens")(x, w)
    torch._dynamo.reset()
    assert len(made) == 1 and made[0] is not None
    return made[0], [x, w]


def _line_of(text: str) -> int:
    lines, start = inspect.getsourcelines(_model)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _refuse_at(wrapper, step_op: str) -> None:
    """Make the step whose ops include `step_op` raise what a refused capture raises."""
    origins = wrapper.runner.origins
    line = next(ln for ln, name in wrapper.step_lines if any(o.startswith(step_op + ".") for o in origins[name].ops))
    # the step's call: its first lines may allocate its outputs
    callee = next(m.group(1) for ln in wrapper.source.splitlines()[line - 1:]
                  if (m := re.search(r"(_[ek]\d+)\(", ln)))

    def refuse(*args, **kwargs):
        raise RuntimeError(REFUSAL)

    wrapper.fn.__globals__[callee] = refuse


@pytest.mark.parametrize("op,text", [("aten.mm", "y @ w"), ("aten.relu", "torch.relu(x)")])
def test_a_refused_capture_names_the_step_its_ops_and_the_users_line(wrapper, op, text):
    w, args = wrapper
    _refuse_at(w, op)
    with pytest.raises(RuntimeError) as caught:
        w(list(args))
    site, location, cause = capture_failure.failure_site(w, caught.value)
    assert op in site and cause is caught.value, site
    assert location is not None and location.line == _line_of(text), (site, location)


def test_the_step_is_found_under_the_error_the_captures_end_raises_over_it(wrapper):
    """torch.cuda.graph's exit ends the capture while the step's error is in flight, and
    CUDA refuses that too: the error that reaches the runtime is the end's."""
    w, args = wrapper
    _refuse_at(w, "aten.mm")
    try:
        try:
            w(list(args))
        finally:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
    except RuntimeError as e:
        site, location, cause = capture_failure.failure_site(w, e)
    assert "aten.mm" in site and str(cause) == REFUSAL, site
    assert location.line == _line_of("y @ w")


def test_an_error_from_outside_the_wrapper_names_no_step(wrapper):
    w, _ = wrapper
    try:
        raise RuntimeError(REFUSAL)  # as the capture's end raises it, after the last step
    except RuntimeError as e:
        assert capture_failure.failure_site(w, e) == ("", None, e)
