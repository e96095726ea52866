"""The program text the worker runs, and the map back to editor documents.

A Python file is its own program (one segment, identity map). A notebook is
its code cells joined in order into one script (one segment per cell) by
`fuselens.notebook_program`, which owns the rules for IPython syntax and the
line map shared with the report and the `%%fuselens` magic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from fuselens import notebook_program as nbp
from fuselens.notebook_program import Segment, split_lines

__all__ = ["ProgramText", "Segment", "notebook_program", "split_lines"]


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
        return nbp.to_cell(self.segments, line)

    def to_program(self, uri: str, line: int) -> Optional[int]:
        """(document URI, 0-based line) -> 0-based program line."""
        return nbp.to_program(self.segments, uri, line)

    def document_line(self, uri: str, line: int) -> Optional[str]:
        for seg in self.segments:
            if seg.uri == uri:
                return seg.lines[line] if 0 <= line < len(seg.lines) else ""
        return None

    def same_file(self, path: str) -> bool:
        return bool(self.path) and _real(path) == _real(self.path)


def notebook_program(notebook_uri: str, cells: list[tuple[str, str]]) -> ProgramText:
    """Join code cells `(cell_uri, text)` in order into one script."""
    text, segments = nbp.join_cells(cells)
    return ProgramText(path="", text=text, segments=segments, notebook_uri=notebook_uri)


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))
