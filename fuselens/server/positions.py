"""Columns from Python's own source positions.

Columns the server sends to the client go through pygls's `PositionCodec`
(the negotiated UTF-16/UTF-8/UTF-32 units); what stays here is the one
conversion pygls has no use for: `ast` and CPython report byte offsets.
"""

from __future__ import annotations


def byte_to_codepoint(line: str, byte_column: int) -> int:
    """A UTF-8 byte offset (what `ast` col_offset and CPython positions give)
    -> code-point column."""
    return len(line.encode("utf-8")[: max(0, byte_column)].decode("utf-8", errors="ignore"))
