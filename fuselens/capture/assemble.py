"""Fold a stream of schema events into one `Report`. Pure: no torch, no I/O.

The worker streams events as they happen and may repeat itself (a graph
break hit on every loop iteration, a kernel seen by two hooks, timing
updates); this module is the one place that decides how they combine:

- GraphBreak: same `key()` (file, line, cell, reason) -> one entry, counts add.
- Recompile: same (compile_id, function) -> one entry, reasons and shape
  changes united, `hit_limit` or-ed, the first non-empty `fix` kept.
- CompiledGraph: same `graph_id` -> the last one wins.
- Kernel: same (graph_id, name) -> the last one wins, timings kept.
- KernelTiming: added to the matching Kernel (also when it arrives first).
- FusionDecision, ErrorEntry: exact duplicates dropped. A compile failure
  ("compile", which otherwise means the graph ran eagerly) that the program
  then raised (`fullgraph=True`, a backend that crashed) did not fall back:
  the exception is its one finding (`raised_compile_failures`).
- PhaseTime: appended; `Timings.compile_s` sums the top-level phases
  (`TOP_LEVEL_PHASES`); other phases are a breakdown inside "backend" and
  name their parent (`PhaseTime.parent`; the worker fills it, `nest_phase`).
- DDPSplit: exact duplicates dropped.
- RunInfo: fields the worker knows (versions, device, exit code) are merged
  into the parent's RunInfo.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional

from fuselens.events import (
    CompiledGraph,
    DDPSplit,
    ErrorEntry,
    FusionDecision,
    GraphBreak,
    Kernel,
    KernelTiming,
    PhaseTime,
    Recompile,
    Report,
    RunInfo,
    Timings,
)

# Phases that do not overlap; their sum is the compile time. Backends may
# emit finer phases ("aot", "lowering", "scheduling", "codegen", ...) that lie
# inside "backend".
TOP_LEVEL_PHASES = ("dynamo", "backend")



def nest_phase(phase: PhaseTime) -> PhaseTime:
    """`phase` with its parent filled: a phase below the top level that names
    no parent lies inside "backend" (the fuselens compiler's aot, lowering,
    scheduling, codegen, cpp_compile all run inside Dynamo's backend call)."""
    if phase.parent or phase.phase in TOP_LEVEL_PHASES:
        return phase
    return dataclasses.replace(phase, parent="backend")


# RunInfo fields only the worker knows; the parent's values win for the rest.
_WORKER_RUN_FIELDS = ("torch_version", "python_version", "device", "exit_code", "max_calls_reached", "caches")


class ReportBuilder:
    """Incremental assembly: `add()` events in stream order, `build()` any time."""

    def __init__(self, run: RunInfo) -> None:
        self.run = run
        self._breaks: dict[tuple, GraphBreak] = {}
        self._recompiles: dict[tuple, Recompile] = {}
        self._graphs: dict[str, CompiledGraph] = {}
        self._kernels: dict[tuple, Kernel] = {}
        self._pending_timing: dict[tuple, list[KernelTiming]] = {}
        self._fusion: list[FusionDecision] = []
        self._errors: list[ErrorEntry] = []
        self._phases: list[PhaseTime] = []
        self._splits: list[DDPSplit] = []
        self.wall_s = 0.0

    def add(self, event: Any) -> None:
        """Fold one event in; unknown objects are ignored."""
        handler = getattr(self, f"_add_{type(event).__name__}", None)
        if handler is not None:
            handler(event)

    def _add_GraphBreak(self, gb: GraphBreak) -> None:
        seen = self._breaks.get(gb.key())
        if seen is None:
            self._breaks[gb.key()] = dataclasses.replace(gb)
        else:
            seen.count += gb.count
            for hint in gb.hints:
                if hint not in seen.hints:
                    seen.hints.append(hint)
            seen.explanation = seen.explanation or gb.explanation
            seen.gb_type = seen.gb_type or gb.gb_type
            seen.registry_id = seen.registry_id or gb.registry_id

    def _add_Recompile(self, rc: Recompile) -> None:
        key = (rc.compile_id, rc.function)
        seen = self._recompiles.get(key)
        if seen is None:
            self._recompiles[key] = dataclasses.replace(rc)
            return
        for name in ("reasons", "raw_reasons", "dtype_changes"):
            target = getattr(seen, name)
            target.extend(v for v in getattr(rc, name) if v not in target)
        seen.shape_changes.extend(s for s in rc.shape_changes if s not in seen.shape_changes)
        seen.hit_limit = seen.hit_limit or rc.hit_limit
        seen.fix = seen.fix or rc.fix

    def _add_CompiledGraph(self, graph: CompiledGraph) -> None:
        gid = graph.graph_id or f"{graph.compile_id}:{graph.stage}"
        self._graphs[gid] = graph

    def _add_Kernel(self, kernel: Kernel) -> None:
        key = (kernel.graph_id, kernel.name)
        old = self._kernels.get(key)
        kernel = dataclasses.replace(kernel)
        if old is not None:
            kernel.calls += old.calls
            kernel.total_time_us += old.total_time_us
        for timing in self._pending_timing.pop(key, []):
            kernel.calls += timing.calls
            kernel.total_time_us += timing.total_time_us
        self._kernels[key] = kernel

    def _add_KernelTiming(self, timing: KernelTiming) -> None:
        key = (timing.graph_id, timing.name)
        kernel = self._kernels.get(key)
        if kernel is None:
            self._pending_timing.setdefault(key, []).append(timing)
        else:
            kernel.calls += timing.calls
            kernel.total_time_us += timing.total_time_us

    def _add_FusionDecision(self, decision: FusionDecision) -> None:
        if decision not in self._fusion:
            self._fusion.append(decision)

    def _add_ErrorEntry(self, error: ErrorEntry) -> None:
        if error not in self._errors:
            self._errors.append(error)

    def _add_DDPSplit(self, split: DDPSplit) -> None:
        if split not in self._splits:
            self._splits.append(split)

    def _add_PhaseTime(self, phase: PhaseTime) -> None:
        self._phases.append(phase)

    def _add_RunInfo(self, info: RunInfo) -> None:
        for name in _WORKER_RUN_FIELDS:
            value = getattr(info, name)
            if value is None or value == "" or value is False:
                continue  # unknown to this sender; 0 (an exit code) is kept
            setattr(self.run, name, value)

    def build(self) -> Report:
        """A Report of everything added so far (a fresh object each call)."""
        kernels = list(self._kernels.values())
        compile_s = sum(p.seconds for p in self._phases if p.phase in TOP_LEVEL_PHASES)
        timings = Timings(
            wall_s=self.wall_s,
            compile_s=round(compile_s, 6),
            phases=list(self._phases),
            kernel_time_us=sum(k.total_time_us for k in kernels),
        )
        recompiles = sorted(self._recompiles.values(), key=lambda r: _compile_order(r.compile_id))
        raised = raised_compile_failures(self._errors)
        return Report(
            run=dataclasses.replace(self.run),
            graph_breaks=list(self._breaks.values()),
            recompiles=recompiles,
            graphs=list(self._graphs.values()),
            kernels=kernels,
            fusion=list(self._fusion),
            errors=[e for e in self._errors if all(e is not d for d in raised)],
            timings=timings,
            ddp_splits=list(self._splits),
        )


def raised_compile_failures(errors: list[ErrorEntry]) -> list[ErrorEntry]:
    """The "compile" entries whose failure the program raised as its
    exception: the exception's message ends with the compile failure's
    (after "fails only under torch.compile (...): " when labelled so)."""
    raised = [_plain(e.message) for e in errors if e.kind == "exception"]
    return [e for e in errors if e.kind == "compile" and _plain(e.message)
            and any(m.endswith(_plain(e.message)) for m in raised)]


def _plain(message: str) -> str:
    # Dynamo's metrics end "raised" where the exception's first line ends "raised:".
    return message.strip().rstrip(":").strip()


def _compile_order(compile_id: str) -> tuple:
    """Sort "frame/compile" ids numerically ("10/0" after "2/0")."""
    parts = []
    for p in compile_id.replace("_", "/").split("/"):
        parts.append((0, int(p), "") if p.isdigit() else (1, 0, p))
    return tuple(parts)


def assemble(events: Iterable[Any], run: Optional[RunInfo] = None, wall_s: float = 0.0) -> Report:
    """One Report from a finished stream of events."""
    builder = ReportBuilder(run or RunInfo(target=""))
    for event in events:
        builder.add(event)
    builder.wall_s = wall_s
    return builder.build()
