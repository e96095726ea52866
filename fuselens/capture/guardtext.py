"""Keep torch's guard texts to what identifies a value. Pure, no torch.

A guard on a Python value prints the whole value (`header == b'\\x00...'`, 2 KB
of escaped binary; a config dict; a long list). A person needs its type, its
size and the first few characters, so every value that reaches a report goes
through `short_value`, and every guard line through `short_guard`
(`MAX_TEXT` characters at most, in every format).

A recompile's artifact also lists, for every earlier compile of the frame,
why its guards failed: recompile n repeats n-1 reasons and a report that
prints them all grows quadratically. `latest_entry` keeps the one that
matters: the failure of the most recent compile, the one just replaced.
"""

from __future__ import annotations

import ast
import re

MAX_TEXT = 200  # no value in any report format is longer than this
_MAX_REPR = 40  # characters of a value's repr kept after its type and size
_PREFIX_RE = re.compile(r"^\s*(?P<frame>\d+)/(?P<compile>\d+):\s*")
_EQ_RE = re.compile(r"^(?P<lhs>.*?\s(?:==|!=|is|is not)\s)(?P<value>.+?)(?P<tail>\s+#.*)?$")


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """`text` on one line, at most `limit` characters (an ellipsis marks a cut)."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


def short_value(text: str) -> str:
    """A guarded value's repr as type, size and a short prefix:
    `b'\\x00\\x01...'` (2 KB) -> `bytes[2049] b'\\x00\\x01\\x02…'`. Short
    values (numbers, small strings) are returned unchanged."""
    text = text.strip()
    if len(text) <= _MAX_REPR:
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return f"{text[:_MAX_REPR]}… ({len(text)} chars)"
    size = f"[{len(value)}]" if hasattr(value, "__len__") else ""
    return f"{type(value).__name__}{size} {text[:_MAX_REPR]}…"


def short_guard(raw: str) -> str:
    """A guard failure line with its value shortened, the `User stack trace`
    dropped, at most MAX_TEXT characters."""
    head = (raw or "").strip().split("\n", 1)[0]
    m = _EQ_RE.match(head)
    if m:
        value = short_value(m.group("value"))
        head = f"{m.group('lhs')}{value}{m.group('tail') or ''}"
    return clip(head)


def guard_value(head: str) -> str:
    """The value side of `lhs == value  # comment`, "" when there is none."""
    m = _EQ_RE.match(head.strip())
    return m.group("value") if m else ""


def entry_of(raw: str) -> tuple[int, int]:
    """(frame, compile) of the cache entry a reason is about, (-1, -1) if none."""
    m = _PREFIX_RE.match(raw or "")
    return (int(m.group("frame")), int(m.group("compile"))) if m else (-1, -1)


def latest_entry(raw_reasons: list[str]) -> list[str]:
    """The reasons of the most recently compiled cache entry only (several
    guards of that one entry may have failed; earlier entries are the older
    recompiles, already reported)."""
    if not raw_reasons:
        return []
    newest = max(entry_of(r) for r in raw_reasons)
    return [r for r in raw_reasons if entry_of(r) == newest]
