"""The JSON view: exactly the schema's serialisation (`Report.to_json`), so
anything that reads fuselens JSON reads it with `Report.from_json`."""

from __future__ import annotations

from fuselens.events import Report


def render_json(report: Report) -> str:
    """`report.to_json()` with a trailing newline, nothing added or dropped."""
    return report.to_json() + "\n"
