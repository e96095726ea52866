"""Running analyses: one at a time per unit, newest request wins, cached.

A *unit* is what one run covers: a script document, a notebook, or a
project entry (`[tool.fuselens] entry`). A new request for a unit cancels the
running one (cancelling `analyze_async` kills the worker) and bumps the
unit's generation; a result whose generation is no longer current is
dropped, so results of an older document version never overwrite newer ones
even when a cancelled worker still manages to answer.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from fuselens.events import ErrorEntry, Report, RunInfo
from fuselens.serialize import from_data
from fuselens.server.program import ProgramText

log = logging.getLogger(__name__)

# Errors that say more about this moment than about the program: not cached.
_TRANSIENT_ERRORS = {"timeout", "killed", "internal"}


@dataclass
class RunPlan:
    """Everything needed to run one analysis and map its results back."""

    unit: str
    kind: str  # Target kind: "script" | "module"
    value: str  # script path or module name
    args: list[str]
    cwd: str
    options: dict[str, Any]  # RunOptions fields
    program: ProgramText  # the text whose lines map to documents
    roots: list[str]  # directories whose files count as the user's
    default_uri: str  # where errors without a location go
    label: str  # shown in progress messages
    versions: dict[str, int] = field(default_factory=dict)  # document versions at request time
    contents: str = ""  # digest of the contents the run depends on
    notebook_cells: list[str] = field(default_factory=list)
    nproc_per_node: Optional[int] = None  # run under torchrun with this many ranks ([tool.fuselens])

    @property
    def key(self) -> str:
        """Cache key: contents, entry, options and torch version."""
        blob = json.dumps(
            {
                "contents": self.contents,
                "target": [self.kind, self.value, self.args, self.cwd, self.nproc_per_node],
                "options": self.options,
                "torch": torch_version(),
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def torch_version() -> str:
    """torch's version from its metadata: importing torch would cost the
    server seconds and hundreds of MB. importlib.metadata is imported here, at the
    first run: at import it cost the server's start ~75 ms (csv, email)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# (path, size, mtime_ns) -> sha256 of the file's bytes: a file is read again only
# when its stat changes, yet the key holds its content (saving unchanged text
# must not re-run the program).
_file_digests: dict[tuple[str, int, int], str] = {}


def _file_digest(path: str, st: os.stat_result) -> str:
    sig = (path, st.st_size, st.st_mtime_ns)
    digest = _file_digests.get(sig)
    if digest is None:
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            digest = "unreadable"
        if len(_file_digests) > 20_000:
            _file_digests.clear()
        _file_digests[sig] = digest
    return digest


def contents_digest(texts: list[str], stat_dirs: list[str] = (), recursive: bool = False, limit: int = 2000) -> str:
    """Hash of the given texts plus the contents of the .py files in
    `stat_dirs` (modules the program imports count too). Contents, not
    modification times: a save that changed nothing is answered from the cache."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8", errors="surrogatepass"))
        h.update(b"\0")
    seen = 0
    for top in stat_dirs:
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules", "venv", "build", "dist"))
            if not recursive:
                dirs[:] = []
            for name in sorted(files):
                if name.endswith(".py") and seen < limit:
                    seen += 1
                    full = os.path.join(root, name)
                    try:
                        st = os.stat(full)
                    except OSError:
                        continue
                    h.update(f"{full}:{_file_digest(full, st)}\0".encode())
    return h.hexdigest()


async def run_plan(plan: RunPlan, on_event: Optional[Callable[[Any], None]] = None) -> Report:
    """Run a plan in the capture worker (imported lazily: not needed to start)."""
    from fuselens.capture import RunOptions, Target, TargetError, analyze_async

    if plan.nproc_per_node:
        return await _run_torchrun(plan)
    try:
        if plan.kind == "entry":
            target = Target.from_cli(plan.args, cwd=plan.cwd)
        else:
            target = Target(plan.kind, plan.value, list(plan.args), plan.cwd)
    except TargetError as exc:
        return error_report(plan, "exception", f"cannot run the configured entry: {exc}")
    return await analyze_async(target, from_data(RunOptions, plan.options), on_event=on_event)


async def _run_torchrun(plan: RunPlan) -> Report:
    """Every rank of the entry (or the document) under torchrun, merged:
    the same launch as `fuselens report --nproc-per-node N`. Cancelling
    stops torchrun and its ranks."""
    from fuselens.capture import RunOptions
    from fuselens.capture.distributed import analyze_distributed_async, launch_for

    argv = list(plan.args) if plan.kind == "entry" else [plan.value, *plan.args]
    cut = 2 if argv[:1] == ["-m"] else 1
    try:
        launch = launch_for(argv[:cut], argv[cut:], plan.nproc_per_node, cwd=plan.cwd)
    except ValueError as exc:
        return error_report(plan, "exception", f"cannot run the configured entry under torchrun: {exc}")
    return await analyze_distributed_async(launch, from_data(RunOptions, plan.options))


def error_report(plan: RunPlan, kind: str, message: str) -> Report:
    return Report(run=RunInfo(target=plan.label), errors=[ErrorEntry(kind, message)])  # type: ignore[arg-type]


Deliver = Callable[[RunPlan, Report, bool], None]
Runner = Callable[[RunPlan, Optional[Callable[[Any], None]]], Awaitable[Report]]


class AnalysisManager:
    """Schedules analyses per unit and keeps the cache."""

    def __init__(self, runner: Runner = run_plan, cache_size: int = 32, debounce_s: float = 0.0) -> None:
        self.runner = runner
        # A run starts only after `debounce_s` without a newer request for its
        # unit: saves in quick succession (a formatter, `:wa`, a save loop) then
        # run once, instead of each taking a worker that the next kills.
        self.debounce_s = debounce_s
        self.cache: OrderedDict[str, Report] = OrderedDict()
        self.cache_size = cache_size
        self.tasks: dict[str, asyncio.Task] = {}
        self.generation: dict[str, int] = {}

    def cached(self, plan: RunPlan) -> Optional[Report]:
        report = self.cache.get(plan.key)
        if report is not None:
            self.cache.move_to_end(plan.key)
        return report

    def submit(
        self, plan: RunPlan, deliver: Deliver, on_event: Optional[Callable[[Any], None]] = None, use_cache: bool = True
    ) -> Optional["asyncio.Task[Optional[Report]]"]:
        """Start (or answer from the cache) an analysis of `plan`; cancels the
        unit's running one. Returns the task, None on a cache hit (delivered
        before returning)."""
        unit = plan.unit
        generation = self.generation[unit] = self.generation.get(unit, 0) + 1
        self.cancel(unit, bump=False)
        if use_cache:
            report = self.cached(plan)
            if report is not None:
                deliver(plan, report, True)
                return None
        task = asyncio.ensure_future(self._run(plan, generation, deliver, on_event))
        self.tasks[unit] = task
        task.add_done_callback(lambda t, u=unit: self.tasks.pop(u, None) if self.tasks.get(u) is t else None)
        return task

    def cancel(self, unit: str, bump: bool = True) -> bool:
        """Cancel the unit's running analysis (and, with `bump`, make any
        result still on its way stale)."""
        if bump:
            self.generation[unit] = self.generation.get(unit, 0) + 1
        task = self.tasks.pop(unit, None)
        if task is not None and not task.done():
            task.cancel()
            return True
        return False

    def running(self, unit: str) -> Optional[asyncio.Task]:
        task = self.tasks.get(unit)
        return task if task is not None and not task.done() else None

    async def _run(self, plan: RunPlan, generation: int, deliver: Deliver, on_event) -> Optional[Report]:
        if self.debounce_s:
            await asyncio.sleep(self.debounce_s)  # a newer request cancels this task here, before any worker
        try:
            report = await self.runner(plan, on_event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server must outlive any failure of a run
            log.exception("analysis of %s failed", plan.label)
            report = error_report(plan, "internal", f"{type(exc).__name__}: {exc}")
        if not any(e.kind in _TRANSIENT_ERRORS for e in report.errors):
            self.cache[plan.key] = report
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        if self.generation.get(plan.unit) != generation:
            log.info("dropping stale result for %s", plan.label)
            return None
        deliver(plan, report, False)
        return report


def summary(report: Optional[Report], status: str, cached: bool = False) -> dict[str, Any]:
    """What `fuselens.analyze` returns to the client."""
    if report is None:
        return {"status": status}
    return {
        "status": status,
        "cached": cached,
        "graph_breaks": len(report.graph_breaks),
        "recompiles": len(report.recompiles),
        "graphs": len(report.graphs),
        "kernels": len(report.kernels),
        "errors": [e.kind for e in report.errors],
        "wall_s": report.timings.wall_s,
    }
