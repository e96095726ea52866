"""`e` in the TUI: write the current run as report files, in the formats of
`fuselens report` (JSON always; Markdown and plain text through the report
renderers when they are installed)."""

from __future__ import annotations

import os
import re
from typing import Callable, Optional

from fuselens.events import Report


def _renderers() -> list[tuple[str, Callable[[Report], str]]]:
    """(extension, render) pairs; the report package is optional here so the
    TUI keeps working if a renderer is missing or broken."""
    out: list[tuple[str, Callable[[Report], str]]] = []
    try:
        from fuselens.report.json_format import render_json

        out.append(("json", render_json))
    except Exception:
        out.append(("json", lambda r: r.to_json() + "\n"))
    try:
        from fuselens.report.markdown import render_markdown

        out.append(("md", render_markdown))
    except Exception:
        pass
    try:
        from fuselens.report.terminal import render_terminal

        out.append(("txt", lambda r: render_terminal(r, width=100, color=False)))
    except Exception:
        pass
    return out


def export_stem(report: Report, run_no: int) -> str:
    """`fuselens-<program>-run<N>`: stable names, no timestamps."""
    base = os.path.basename(report.run.target.replace("-m ", "")) or "program"
    base = re.sub(r"\.(py|ipynb)$", "", base)
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", base)
    return f"fuselens-{base}-run{run_no}"


def export_report(report: Report, directory: str, run_no: int) -> tuple[list[str], list[str]]:
    """Write the report in every available format into `directory`.
    Returns (paths written, problems); never raises for one failing format."""
    os.makedirs(directory, exist_ok=True)
    stem = export_stem(report, run_no)
    written: list[str] = []
    problems: list[str] = []
    for ext, render in _renderers():
        path = os.path.join(directory, f"{stem}.{ext}")
        try:
            text = render(report)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            written.append(path)
        except Exception as exc:  # a renderer bug must not lose the JSON export
            problems.append(f"{ext}: {type(exc).__name__}: {exc}")
    return written, problems


def relative(path: str, cwd: Optional[str] = None) -> str:
    try:
        rel = os.path.relpath(path, cwd or os.getcwd())
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
