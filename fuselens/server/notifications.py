"""Notifications of our own that the server sends beside LSP's: when an
analysis starts and when it finishes, with its counts. The VS Code status
bar reads these instead of the text of work-done progress messages.

pygls's converter writes the fields in camelCase (`graphBreaks`) and leaves
out those that are None."""

from __future__ import annotations

from typing import Optional

import attrs

from fuselens.events import Report
from fuselens.server.analysis import RunPlan

ANALYSIS_STARTED = "fuselens/analysisStarted"
ANALYSIS_FINISHED = "fuselens/analysisFinished"


@attrs.define
class AnalysisStarted:
    """A run of the unit of `uri` began (a worker runs the program)."""

    uri: str


@attrs.define
class AnalysisFinished:
    """An analysis ended. Counts are None when it ended without a result
    (cancelled): the client then counts the diagnostics it holds."""

    # status and cached have no default: pygls's converter leaves out
    # fields equal to their default, and the client should see both.
    uri: str
    status: str  # "ok" | "cancelled"
    cached: bool
    version: Optional[int] = None
    graph_breaks: Optional[int] = None
    recompiles: Optional[int] = None
    errors: Optional[int] = None
    seconds: Optional[float] = None

    @classmethod
    def of(cls, plan: RunPlan, report: Report, cached: bool) -> "AnalysisFinished":
        uri = subject_uri(plan)
        return cls(
            uri=uri,
            status="ok",
            version=plan.versions.get(uri),
            cached=cached,
            graph_breaks=len(report.graph_breaks),
            recompiles=len(report.recompiles),
            errors=len(report.errors),
            seconds=report.timings.wall_s,
        )

    @classmethod
    def cancelled(cls, plan: RunPlan) -> "AnalysisFinished":
        uri = subject_uri(plan)
        return cls(uri=uri, status="cancelled", cached=False, version=plan.versions.get(uri))


def subject_uri(plan: RunPlan) -> str:
    """The document a run is about, as the user sees it: the notebook rather
    than its first cell, the entry script of a project."""
    return plan.program.notebook_uri or plan.default_uri
