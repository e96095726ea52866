"""Where a CUDA graph capture failed, and the finding that says so: the step of the
generated wrapper that raised, its ATen ops and the user's line it computes."""

from __future__ import annotations

from typing import Any


def plan_of(runner: Any) -> Any:
    """The GraphRunner behind a compiled graph's callable: a generated wrapper keeps the
    plan it was printed from."""
    return getattr(runner, "runner", runner)


def failure_site(runner: Any, error: BaseException) -> tuple[str, Any, BaseException]:
    """Where in the graph a capture stopped: ("at <step> (<its ATen ops>): ", the user's
    line it computes, the error the step raised), or ("", None, `error`) when no step of
    the generated wrapper raised it (the capture's end alone, say)."""
    failed_step = getattr(runner, "failed_step", None)
    found = failed_step(error) if failed_step is not None else None
    if found is None:
        return "", None, error
    name, cause = found
    origin = getattr(plan_of(runner), "origins", {}).get(name)
    if origin is None:
        return f"at {name}: ", None, cause
    from fuselens.compiler.explain import location_from_stack

    ops = ", ".join(dict.fromkeys(origin.ops[:6]))
    return f"at {name} ({ops}): ", location_from_stack(origin.stack_trace), cause


def report_failed_capture(graph_id: str, error: str, location: Any = None) -> None:
    """A finding for a capture CUDA refused (what runtime/capture_check.py did not foresee),
    at the user's line of the step it stopped at when known."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    sink.emit(ErrorEntry(kind="fallback", message=f"graph {graph_id} runs without CUDA graphs: its capture failed "
                         f"({error})", location=location))
