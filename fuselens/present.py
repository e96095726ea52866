"""How every view writes times, op names and places. No torch.

The report (terminal, Markdown, HTML), the editor's lenses and hovers and
the TUI call these, so one kernel reads the same everywhere ("3.40 ms", not
"3.4 ms" in one view and "3.40 ms" in another).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from fuselens.events import SourceLocation

MISSING = "—"  # a time that was not measured
RECOMPILE_LIMIT = "recompile limit reached: Dynamo gave up and runs this function eagerly"

# aten overload names that say nothing to a reader (`add.Tensor` is `add`).
_OP_NAMESPACES = ("aten", "prims", "torch", "quantized")
_OVERLOADS = ("default", "Tensor", "Scalar", "int", "dim_IntList", "self", "out")


def _sig3(value: float) -> str:
    """Three significant digits: 812, 43.0, 3.40."""
    a = abs(value)
    if a >= 100:
        return f"{value:.0f}"
    if a >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def duration_us(us: Optional[float]) -> str:
    """Microseconds in the unit a person reads, three significant digits:
    812 µs, 3.40 ms, 1.25 s; 45.2 µs below 100 µs; "—" when not measured."""
    if us is None:
        return MISSING
    a = abs(us)
    if a >= 1e6:
        return f"{_sig3(us / 1e6)} s"
    if a >= 1e3:
        return f"{_sig3(us / 1e3)} ms"
    if a >= 100 or a == 0:
        return f"{us:.0f} µs"
    return f"{us:.1f} µs"


def duration_s(seconds: Optional[float]) -> str:
    """Seconds, by the rule of `duration_us` (0.0034 -> "3.40 ms")."""
    return MISSING if seconds is None else duration_us(seconds * 1e6)


def short_op(op: str) -> str:
    """`aten.native_layer_norm.default` -> `native_layer_norm`,
    `aten.add.Tensor` -> `add`; other names lose only a `torch.` prefix."""
    parts = op.split(".")
    if parts and parts[0] in _OP_NAMESPACES:
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] in _OVERLOADS:
        parts = parts[:-1]
    return ".".join(parts) or op


def display_path(file: str, root: Optional[str] = None) -> str:
    """`file` relative to `root` when it lies inside it, else unchanged."""
    if not root or not file or not os.path.isabs(file):
        return file
    try:
        rel = os.path.relpath(file, root)
    except ValueError:  # another drive on Windows
        return file
    return file if rel.startswith("..") else rel


def location_label(loc: Optional[SourceLocation], root: Optional[str] = None) -> str:
    """`path:line` (`path:cellN:line` in notebooks), the path relative to
    `root` when inside it; "" without a location."""
    if loc is None:
        return ""
    return dataclasses.replace(loc, file=display_path(loc.file, root)).label()


def short_location(file: str, line: int) -> str:
    """`model.py:12`: the file's name only, for narrow columns."""
    return f"{os.path.basename(file)}:{line}"
