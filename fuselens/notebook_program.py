"""Notebooks as programs: the one set of rules for every view. No torch.

A notebook runs as its code cells in order. IPython-only syntax is made
inert line by line, keeping the line count, so a line of the program maps
back to a cell and a cell-relative line:

- a cell magic that is not Python (`%%bash`) blanks the whole cell; one
  whose body is Python (`%%time`) blanks only its own line;
- a line magic, shell escape or help request (`%time f()`, `!pip ...`,
  `obj?`, `??obj`) becomes `pass` at the same indentation, so the block
  around it stays valid;
- a captured shell or magic result (`x = !ls`, `t = %timeit -o f()`) keeps
  its assignment with a placeholder value (`[]` for a shell capture, which
  IPython returns as a list; `None` for a magic), so a later cell that uses
  the name runs instead of raising NameError.

Two ways to map back share these rules: the worker compiles each cell under
the file name `<path>#cell<N>` (`cell_filename` / `split_cell_filename`),
and the language server joins the cells into one script whose lines map to
cell documents through `Segment`s (`join_cells`, `to_cell`, `to_program`).
The `%%fuselens` magic writes its cells with `write_notebook` and relabels
the worker's `<path>#cell<N>` names with `cell_ref_pattern`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

# Cell magics whose body is still Python: only the magic line is blanked.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "python", "python3"})

_CELL_RE = re.compile(r"^(?P<path>.*\.ipynb)#cell(?P<cell>\d+)$")
_LINE_END = re.compile(r"\r\n|\r|\n")
# `x = !ls`, `a, b = %sx ls`, `self.t = %timeit -o f()`: an assignment target, then `!` or `%`.
_CAPTURE = re.compile(r"^(?P<indent>\s*)(?P<lhs>[A-Za-z_][\w.,\s\[\]]*?\s*=\s*)(?P<escape>[!%])")


@dataclass
class Cell:
    """A code cell as the worker runs it."""

    index: int  # among code cells, 0-based
    source: str  # IPython lines made inert
    filename: str  # `<path>#cell<index>`


@dataclass
class Segment:
    """Lines [start, start + len(lines)) of a joined program are document `uri`."""

    uri: str
    start: int
    lines: list[str]  # the document's own lines, as the editor shows them


def split_lines(text: str) -> list[str]:
    """Lines without their endings; "a\\n" is one line, "" is one empty line."""
    # Only the line ends Python itself knows: str.splitlines() also splits on
    # form feeds and U+2028, which would shift every line after them.
    lines = _LINE_END.split(text)
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def cell_magic(source: str) -> Optional[str]:
    """The name of the cell magic on the cell's first non-blank line
    (`%%bash -s` -> "bash"), "" for a bare `%%`, None for a plain cell."""
    first = next((line.strip() for line in split_lines(source) if line.strip()), "")
    if not first.startswith("%%"):
        return None
    words = first[2:].split()
    return words[0] if words else ""


def neutralize_lines(lines: list[str]) -> list[str]:
    """The cell's lines with IPython syntax made inert, one line for each."""
    magic = cell_magic("\n".join(lines))
    if magic is not None and magic not in PYTHON_CELL_MAGICS:
        return ["" for _ in lines]
    out = []
    seen_code = False
    for line in lines:
        if magic is not None and not seen_code and line.strip():
            seen_code = True
            out.append("")  # the `%%time` line itself
            continue
        seen_code = seen_code or bool(line.strip())
        out.append(neutralize_line(line))
    return out


def neutralize_line(line: str) -> str:
    """One line with a line magic, shell escape or help request made inert."""
    stripped = line.lstrip()
    indent = line[: len(line) - len(stripped)]
    if not stripped or stripped.startswith("#"):
        return line
    if stripped.startswith(("%", "!")) or _is_help(stripped):
        return indent + "pass"
    match = _CAPTURE.match(line)
    if match:
        placeholder = "[]" if match.group("escape") == "!" else "None"
        return match.group("indent") + match.group("lhs") + placeholder
    return line


def neutralize_ipython(source: str) -> str:
    """`neutralize_lines` for a whole cell's text (line ends become "\\n")."""
    return "\n".join(neutralize_lines(split_lines(source)))


def _is_help(stripped: str) -> bool:
    """`obj?`, `obj.attr??`, `?obj`, `??obj` (not `x = a if b else c`)."""
    body = stripped.strip("?")
    if body == stripped or not body:
        return False
    return all(part.isidentifier() for part in body.split("."))


# -- per-cell file names (the worker) -------------------------------------------
def cell_filename(path: str, index: int) -> str:
    return f"{path}#cell{index}"


def split_cell_filename(filename: str) -> Optional[tuple[str, int]]:
    """`/a/nb.ipynb#cell3` -> ("/a/nb.ipynb", 3); None for ordinary files."""
    m = _CELL_RE.match(filename or "")
    return (m.group("path"), int(m.group("cell"))) if m else None


def cell_ref_pattern(path: str) -> re.Pattern[str]:
    """Matches `cell_filename(path, N)` inside text; group 1 is N."""
    return re.compile(re.escape(path) + r"#cell(\d+)")


def load_cells(path: str) -> list[Cell]:
    """Code cells of the notebook at `path`, in order, IPython lines inert."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    cells: list[Cell] = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        index = len(cells)
        cells.append(Cell(index, neutralize_ipython(_cell_text(cell)), cell_filename(path, index)))
    return cells


def write_notebook(sources: list[str], path: str) -> None:
    """Writes code cells as an nbformat 4 notebook (what `load_cells` reads)."""
    cells = [
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
        for src in sources
    ]
    nb = {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(nb, f)


def _cell_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


# -- one joined script (the language server) ------------------------------------
def join_cells(cells: list[tuple[str, str]]) -> tuple[str, list[Segment]]:
    """Code cells `(cell_uri, text)` in order as one script, and the segment
    of each cell in it."""
    parts: list[str] = []
    segments: list[Segment] = []
    for cell_uri, text in cells:
        doc_lines = split_lines(text)
        segments.append(Segment(cell_uri, len(parts), doc_lines))
        parts.extend(neutralize_lines(doc_lines))
    return "\n".join(parts) + "\n", segments


def to_cell(segments: list[Segment], line: int) -> Optional[tuple[str, int]]:
    """0-based program line -> (document URI, 0-based line in it)."""
    for seg in segments:
        if seg.start <= line < seg.start + max(1, len(seg.lines)):
            return seg.uri, line - seg.start
    return None


def to_program(segments: list[Segment], uri: str, line: int) -> Optional[int]:
    """(document URI, 0-based line) -> 0-based program line."""
    for seg in segments:
        if seg.uri == uri:
            return seg.start + line
    return None
