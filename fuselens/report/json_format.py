"""The JSON view: the schema's serialisation (`Report.to_json`) of the bounded report, so
anything that reads fuselens JSON reads it with `Report.from_json`."""

from __future__ import annotations

from fuselens.events import Report
from fuselens.report import common


def render_json(report: Report) -> str:
    """`report.to_json()` with a trailing newline, every field kept, each
    value bounded like every other format's (`common.bounded`)."""
    return common.bounded(report).to_json() + "\n"
