"""The program text the worker runs, and the map back to editor documents.

A Python file is its own program (one segment, identity map). A notebook is
its code cells joined in order into one script (one segment per cell), so
that cells run as one program and every line of the script maps back to a
cell URI and a cell-relative line. IPython magics (`%time`, `!pip`) become
`pass` lines of the same indentation so that line numbers stay put.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional

# Cell magics whose body is still Python: only the magic line is dropped.
_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug"}
_LINE_END = re.compile(r"\r\n|\r|\n")
_LINE_MAGIC = re.compile(r"^(\s*)(?:[%!]|[\w.]+\s*=\s*[%!])")


@dataclass
class Segment:
    """Lines [start, start + len(lines)) of the program are document `uri`."""

    uri: str
    start: int
    lines: list[str]  # the document's own lines, as the editor shows them


@dataclass
class ProgramText:
    path: str  # the file the worker runs ("" until written, for notebooks)
    text: str
    segments: list[Segment] = field(default_factory=list)
    notebook_uri: Optional[str] = None

    @classmethod
    def for_script(cls, path: str, uri: str, text: str) -> "ProgramText":
        return cls(path=path, text=text, segments=[Segment(uri, 0, split_lines(text))])

    @property
    def uris(self) -> list[str]:
        return [s.uri for s in self.segments]

    def lines(self) -> list[str]:
        return split_lines(self.text)

    def to_document(self, line: int) -> Optional[tuple[str, int]]:
        """0-based program line -> (document URI, 0-based line in it)."""
        for seg in self.segments:
            if seg.start <= line < seg.start + max(1, len(seg.lines)):
                return seg.uri, line - seg.start
        return None

    def to_program(self, uri: str, line: int) -> Optional[int]:
        """(document URI, 0-based line) -> 0-based program line."""
        for seg in self.segments:
            if seg.uri == uri:
                return seg.start + line
        return None

    def document_line(self, uri: str, line: int) -> Optional[str]:
        for seg in self.segments:
            if seg.uri == uri:
                return seg.lines[line] if 0 <= line < len(seg.lines) else ""
        return None

    def same_file(self, path: str) -> bool:
        return bool(self.path) and _real(path) == _real(self.path)


def split_lines(text: str) -> list[str]:
    """Lines without their endings; "a\\n" is one line, "" is one empty line."""
    # Only the line ends Python itself knows: str.splitlines() also splits on
    # form feeds and U+2028, which would shift every line after them.
    lines = _LINE_END.split(text)
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def notebook_program(notebook_uri: str, cells: list[tuple[str, str]]) -> ProgramText:
    """Join code cells `(cell_uri, text)` in order into one script."""
    parts: list[str] = []
    segments: list[Segment] = []
    start = 0
    for cell_uri, text in cells:
        doc_lines = split_lines(text)
        run_lines = _without_magics(doc_lines)
        segments.append(Segment(cell_uri, start, doc_lines))
        parts.extend(run_lines)
        start += len(run_lines)
    return ProgramText(path="", text="\n".join(parts) + "\n", segments=segments, notebook_uri=notebook_uri)


def _without_magics(lines: list[str]) -> list[str]:
    first = next((l.strip() for l in lines if l.strip()), "")
    if first.startswith("%%"):
        name = first[2:].split()[0] if first[2:].split() else ""
        if name not in _PYTHON_CELL_MAGICS:
            return ["pass"] * len(lines)  # %%bash, %%writefile...: not Python
    out = []
    for line in lines:
        match = _LINE_MAGIC.match(line)
        out.append(f"{match.group(1)}pass" if match else line)
    return out


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))
