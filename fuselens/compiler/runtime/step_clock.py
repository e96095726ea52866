"""The program's steps, for the CUDA-graph runners (cuda_graphs.py): a graph warms up in
one step and captures in a later one, as reduce-overhead's CUDA graph trees record only in
a generation after their warm-ups."""

from __future__ import annotations

import itertools
import sys
from typing import Any

# Dynamo's generation counter; a torch without it makes every call a step of its own (a
# position's second call captures)
try:
    from torch._dynamo.mutation_guard import GenerationTracker as _GENERATION
except ImportError:
    _GENERATION = None
_CALLS = itertools.count()
_MARKS: Any = None  # torch's MarkStepBox, once imported


def compiled_calls() -> tuple[str, int]:
    """What tells the program's steps apart, as reduce-overhead's CUDA graph trees read it:
    the count of `torch.compiler.cudagraph_mark_step_begin()` calls once the user makes them,
    else Dynamo's generation, which every call from eager code into a compiled function bumps
    (a backward runs in the generation of the last call before it)."""
    global _MARKS
    if _MARKS is None:  # imported by the first mark
        _MARKS = getattr(sys.modules.get("torch._inductor.cudagraph_trees"), "MarkStepBox", None)
    marked = getattr(_MARKS, "mark_step_counter", 0)
    if marked:
        return ("marked", marked)
    return ("generation", _GENERATION.generation) if _GENERATION is not None else ("calls", next(_CALLS))


class StepClock:
    """Counts the program's steps for the runners, as reduce-overhead's CUDA graph trees begin
    a generation: a forward or inference call begins a step when `compiled_calls` moved since
    the step began, unless a training forward's backward has not run yet (two views of a
    batch through the model, then one backward: one step); a user's mark begins one anyway.
    A backward never begins one (a loss compiled apart from its model is a call of its own)."""

    def __init__(self, source: Any = None) -> None:
        self.source = source or compiled_calls
        self.step = 0
        self.began: Any = None  # what `source` said when this step began
        self.pending = False  # a training forward ran whose backward has not

    def of_call(self, backward: bool, training_forward: bool) -> int:
        """The step a runner's call is in."""
        if backward:
            self.pending = False
            return self.step
        now = self.source()
        if now != self.began and (not self.pending or now[0] == "marked"):
            self.began = now
            self.step += 1
        self.pending |= training_forward
        return self.step


STEP_CLOCK = StepClock()
