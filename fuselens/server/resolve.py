"""From a `SourceLocation` of the schema to an editor place (URI, line,
range in the client's position encoding)."""

from __future__ import annotations

import os
from typing import Callable, Optional

from lsprotocol import types
from pygls.workspace import PositionCodec

from fuselens.events import SourceLocation
from fuselens.server.program import ProgramText, split_lines

# path -> (uri, lines) for documents the editor has open (their text may be
# newer than the disk).
OpenDocs = Callable[[str], Optional[tuple[str, list[str]]]]


def path_to_uri(path: str) -> str:
    from pygls.uris import from_fs_path

    return from_fs_path(path) or f"file://{path}"


class Resolver:
    """Maps report locations of one run onto editor documents.

    Locations in the program the worker ran go through `program` (a notebook
    maps to cell URIs); other files are reported only when they lie under one
    of `roots` (the user's code, not site-packages)."""

    def __init__(
        self,
        program: ProgramText,
        roots: list[str],
        codec: PositionCodec = PositionCodec(),
        open_doc: Optional[OpenDocs] = None,
        notebook_cells: Optional[list[str]] = None,
        default_uri: Optional[str] = None,
    ) -> None:
        self.program = program
        self.roots = [os.path.realpath(r) for r in roots if r]
        self.codec = codec  # code-point columns -> the client's units
        self._open_doc = open_doc or (lambda path: None)
        self._notebook_cells = notebook_cells or []
        self.default_uri = default_uri or (program.segments[0].uri if program.segments else "")
        self._lines: dict[str, list[str]] = {}

    def locate(self, loc: Optional[SourceLocation]) -> Optional[tuple[str, int]]:
        """(uri, 0-based line) for a location, None when not the user's file."""
        if loc is None or not loc.file or loc.line < 1:
            return None
        if loc.cell is not None and loc.file.endswith(".ipynb"):
            if 0 <= loc.cell < len(self._notebook_cells):
                return self._notebook_cells[loc.cell], loc.line - 1
            return None
        if self.program.same_file(loc.file):
            return self.program.to_document(loc.line - 1)
        if loc.file.startswith("<") or not os.path.isabs(loc.file):
            return None
        real = os.path.realpath(loc.file)
        if not any(real == r or real.startswith(r + os.sep) for r in self.roots):
            return None
        opened = self._open_doc(real)
        if opened is not None:
            uri, lines = opened
            self._lines.setdefault(uri, lines)
            return uri, loc.line - 1
        uri = path_to_uri(real)
        if uri not in self._lines:
            self._lines[uri] = _read_lines(real)
        return uri, loc.line - 1

    def line_text(self, uri: str, line: int) -> str:
        text = self.program.document_line(uri, line)
        if text is not None:
            return text
        lines = self._lines.get(uri, [])
        return lines[line] if 0 <= line < len(lines) else ""

    def line_range(self, uri: str, line: int) -> types.Range:
        """The line's code, from its first non-blank character to its end."""
        text = self.line_text(uri, line)
        start = len(text) - len(text.lstrip())
        end = len(text.rstrip())
        if end <= start:
            start, end = 0, len(text)
        return types.Range(
            start=types.Position(line=max(line, 0), character=self.codec.client_num_units(text[:start])),
            end=types.Position(line=max(line, 0), character=self.codec.client_num_units(text[:end])),
        )

    def line_end(self, uri: str, line: int) -> types.Position:
        text = self.line_text(uri, line)
        return types.Position(line=line, character=self.codec.client_num_units(text.rstrip()))

    def location(self, loc: SourceLocation) -> Optional[types.Location]:
        where = self.locate(loc)
        if where is None:
            return None
        uri, line = where
        return types.Location(uri=uri, range=self.line_range(uri, line))


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            return split_lines(f.read(4_000_000).decode("utf-8", errors="replace"))
    except OSError:
        return []
