"""Notebooks as programs: code cells in order, IPython syntax made inert.

Each cell is compiled under a synthetic file name `<path>#cell<N>` (N = the
0-based index among code cells) so that every frame, traceback and Dynamo
record can be mapped back to (notebook, cell, line) by `split_cell_filename`.
Magics and shell lines become `pass` at the same indentation so that line
numbers stay cell-relative and the block structure stays valid. No torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

_CELL_RE = re.compile(r"^(?P<path>.*\.ipynb)#cell(?P<cell>\d+)$")
# `x = !ls` / `y = %time f()`: keep the assignment so later cells see a name.
_ASSIGN_MAGIC_RE = re.compile(r"^(?P<indent>\s*)(?P<lhs>[A-Za-z_][\w.,\s\[\]]*?\s*=\s*)[!%]")
# Cell magics whose body is still Python.
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug", "python", "python3"}


@dataclass
class Cell:
    index: int  # among code cells, 0-based
    source: str  # after magics were made inert
    filename: str  # `<path>#cell<index>`


def cell_filename(path: str, index: int) -> str:
    return f"{path}#cell{index}"


def split_cell_filename(filename: str) -> Optional[tuple[str, int]]:
    """`/a/nb.ipynb#cell3` -> ("/a/nb.ipynb", 3); None for ordinary files."""
    m = _CELL_RE.match(filename or "")
    return (m.group("path"), int(m.group("cell"))) if m else None


def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def neutralize_ipython(source: str) -> str:
    """Replace IPython-only lines with Python that keeps line numbers.

    A cell magic (`%%bash`) that is not Python makes the whole cell inert;
    `%%time`-like magics keep their body."""
    lines = source.split("\n")
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].lstrip()[2:].split()[0] if lines[0].lstrip()[2:].split() else ""
        if magic not in _PYTHON_CELL_MAGICS:
            return "\n".join("" for _ in lines)
        lines[0] = ""
    out = []
    for line in lines:
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith(("%", "!")) or (stripped.endswith("?") and not stripped.startswith("#") and _is_help(stripped)):
            out.append(indent + "pass")
            continue
        m = _ASSIGN_MAGIC_RE.match(line)
        if m and not stripped.startswith("#"):
            out.append(m.group("indent") + m.group("lhs") + "None")
            continue
        out.append(line)
    return "\n".join(out)


def _is_help(stripped: str) -> bool:
    """`obj?` / `obj??` help requests (not `x = a if b else c`)."""
    body = stripped.rstrip("?")
    return bool(body) and all(part.isidentifier() for part in body.split("."))


def load_cells(path: str) -> list[Cell]:
    """Code cells of the notebook at `path`, in order, IPython lines inert."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    cells = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        index = len(cells)
        cells.append(Cell(index, neutralize_ipython(_cell_text(cell)), cell_filename(path, index)))
    return cells
