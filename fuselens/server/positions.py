"""Columns in the negotiated position encoding.

Python strings index code points; LSP clients count UTF-16 code units (VS
Code, the default) or UTF-8 bytes (Neovim >= 0.10 may ask for it). Every
column the server sends goes through `to_client`, every column it receives
through `from_client`.
"""

from __future__ import annotations

UTF8 = "utf-8"
UTF16 = "utf-16"
UTF32 = "utf-32"


def _units(ch: str, encoding: str) -> int:
    cp = ord(ch)
    if encoding == UTF8:
        return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4
    if encoding == UTF16:
        return 2 if cp >= 0x10000 else 1
    return 1


def to_client(line: str, column: int, encoding: str) -> int:
    """Code-point `column` of `line` -> client units (clamped to the line)."""
    column = max(0, min(column, len(line)))
    if encoding == UTF32:
        return column
    return sum(_units(ch, encoding) for ch in line[:column])


def from_client(line: str, units: int, encoding: str) -> int:
    """Client `units` into `line` -> code-point column (clamped to the line)."""
    if encoding == UTF32:
        return max(0, min(units, len(line)))
    seen = 0
    for index, ch in enumerate(line):
        if seen >= units:
            return index
        seen += _units(ch, encoding)
    return len(line)


def byte_to_codepoint(line: str, byte_column: int) -> int:
    """A UTF-8 byte offset (what `ast` col_offset and CPython positions give)
    -> code-point column."""
    return len(line.encode("utf-8")[: max(0, byte_column)].decode("utf-8", errors="ignore"))
