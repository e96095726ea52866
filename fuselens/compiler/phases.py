"""Compile phases of one graph, timed once for both audiences: fuselens's own
`PhaseTime` events and torch's compile metrics (`torch._dynamo.utils.dynamo_timed`:
`compilation_time_metrics`, the chromium trace / tlparse events), where this
torch has them."""

from __future__ import annotations

import contextlib
import inspect
import time
from typing import Any, Callable, ContextManager, Iterator, Optional

from fuselens.events import PhaseTime


def _torch_timer() -> Optional[Callable[[str], ContextManager[Any]]]:
    try:
        from torch._dynamo.utils import dynamo_timed
    except ImportError:  # pragma: no cover - a torch without it: plain timing only
        return None
    try:
        params = inspect.signature(dynamo_timed).parameters
    except (TypeError, ValueError):  # pragma: no cover
        params = {}
    # the event in torch's compile trace (tlparse) too, on the torch versions that take the flag
    kwargs = {"log_pt2_compile_event": True} if "log_pt2_compile_event" in params else {}
    return lambda key: dynamo_timed(key, **kwargs)


_TORCH_TIMED = _torch_timer()


class CompilePhases:
    """The phase times of one graph's compile, in the order they ran."""

    def __init__(self, compile_id: str) -> None:
        self.compile_id = compile_id
        self.seconds: list[tuple[str, float]] = []

    def add(self, phase: str, seconds: float) -> None:
        """A phase timed elsewhere (AOTAutograd's, which starts before this graph exists)."""
        self.seconds.append((phase, seconds))

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Time the block as `phase`; a block that raises records nothing."""
        torch_timed = _TORCH_TIMED(f"fuselens.{phase}") if _TORCH_TIMED is not None else contextlib.nullcontext()
        t = time.perf_counter()
        with torch_timed:
            yield
        self.seconds.append((phase, time.perf_counter() - t))

    def events(self) -> list[PhaseTime]:
        return [PhaseTime(phase=p, seconds=s, compile_id=self.compile_id) for p, s in self.seconds]
