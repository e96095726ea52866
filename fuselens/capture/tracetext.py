"""Read the free-text payloads of torch's structured trace. Pure, no torch.

Two artifacts carry their content only as text: `dynamo_graph_break_reason`
and `recompile_reasons`. Everything else in the trace is structured and is
read as such in `tracehandler.py`; these parsers are the only place where
fuselens reads torch's prose, and they fail soft (unknown text is passed
through verbatim).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from fuselens.capture.frames import make_location, resume_line, user_function_name
from fuselens.capture.guardtext import clip, guard_value, short_value

_FRAME_RE = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<fn>.+?)\s*$')
_GB_ID_RE = re.compile(r"/gb/gb(?P<id>\d+)\.html")
_AT_RE = re.compile(r"^Graph break in user code at (?P<file>.+):(?P<line>\d+)\s*$")


@dataclass
class ParsedGraphBreak:
    reason: str = ""
    gb_type: str = ""
    explanation: str = ""
    hints: list[str] = field(default_factory=list)
    registry_id: str = ""
    at: Optional[tuple[str, int]] = None  # "Graph break in user code at FILE:LINE"
    frames: list[tuple[str, int, str]] = field(default_factory=list)  # user code traceback, outermost first


def parse_graph_break(text: str) -> ParsedGraphBreak:
    """Parse the `dynamo_graph_break_reason` artifact (see RECIPES.md).

    Layout (torch 2.11-2.13): "Graph break in user code at F:L", then
    "Graph Break Reason: <reason>" possibly followed by a registry title
    line, indented "Explanation:" / "Hint:" blocks, a "Developer debug
    context:" block, a gbNNNN link, "User code traceback:" with `File ...`
    frames, then Dynamo's own traceback (ignored)."""
    out = ParsedGraphBreak()
    lines = text.splitlines()
    section = "head"
    reason_lines: list[str] = []
    current: Optional[list[str]] = None  # lines of the explanation/hint being read
    for raw in lines:
        line = raw.strip()
        if section == "traceback":
            m = _FRAME_RE.match(raw)
            if m:
                out.frames.append((m.group("file"), int(m.group("line")), m.group("fn")))
                continue
            if line.startswith("Traceback (most recent call last)"):
                break
            continue
        m = _AT_RE.match(line)
        if m and out.at is None:
            out.at = (m.group("file"), int(m.group("line")))
            continue
        if line.startswith("Graph Break Reason:"):
            section = "reason"
            reason_lines.append(line[len("Graph Break Reason:") :].strip())
            continue
        if line.startswith("User code traceback:"):
            section = "traceback"
            continue
        gid = _GB_ID_RE.search(line)
        if gid:
            out.registry_id = f"GB{gid.group('id')}"
            continue
        if line.startswith("Explanation:"):
            current = [line[len("Explanation:") :].strip()]
            out.explanation = ""
            section = "explanation"
            continue
        if line.startswith("Hint:"):
            _close(out, section, current)
            current = [line[len("Hint:") :].strip()]
            out.hints.append("")
            section = "hint"
            continue
        if line.startswith("Developer debug context:"):
            _close(out, section, current)
            section, current = "debug", None
            continue
        if section == "reason":
            reason_lines.append(line)
        elif section in ("explanation", "hint") and current is not None:
            current.append(line)
    if section in ("explanation", "hint"):
        _close(out, section, current)
    # The reason is either one line, or "Encountered graph break when
    # attempting to trace X:" followed by the registry title (gb_type).
    reason_lines = [r for r in reason_lines if r]
    if reason_lines:
        out.reason = reason_lines[0]
        if len(reason_lines) > 1:
            out.gb_type = reason_lines[1]
            if out.reason.startswith("Encountered graph break when attempting to trace"):
                out.reason = reason_lines[1]
        else:
            out.gb_type = reason_lines[0]
    return out


def _join(lines: list[str]) -> str:
    return "\n".join(l for l in lines).strip()


def _close(out: ParsedGraphBreak, section: str, current: Optional[list[str]]) -> None:
    if current is None:
        return
    if section == "explanation":
        out.explanation = _join(current)
    elif section == "hint" and out.hints:
        out.hints[-1] = _join(current)


# ---------------------------------------------------------------- recompiles

_PREFIX_RE = re.compile(r"^\s*(?P<cid>\d+/\d+):\s*")
_SIZE_RE = re.compile(
    r"tensor '(?P<name>.+?)' (?P<what>size|stride) mismatch at index (?P<dim>\d+)\. expected (?P<old>[^,]+), actual (?P<new>\S+)"
)
_DTYPE_RE = re.compile(r"tensor '(?P<name>.+?)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)")
_NDIM_RE = re.compile(r"tensor '(?P<name>.+?)' rank mismatch\. expected (?P<old>\d+), actual (?P<new>\d+)")
_TENSOR_OTHER_RE = re.compile(r"tensor '(?P<name>[^']+)' (?P<rest>.+)")
_VALUE_RE = re.compile(r"^(?P<lhs>[\w\[\]'\".]+)\s*==\s*(?P<value>[^#]+?)\s*(#|$)")
_SOURCE_RE = re.compile(r"(?:L|G)\['(?P<name>[^']+)'\]")
_STACK_RE = re.compile(r"^___stack(?P<n>\d+)$")
_GUARD_AT_RE = re.compile(r"#\s*(?P<code>.*?)\s*#\s*(?P<file>[^#]+?):(?P<line>\d+) in (?P<fn>\S+)\s*$")

# Dynamo prints dtypes by their C++ names.
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
}


@dataclass
class GuardFailure:
    """One failed guard, translated."""

    text: str  # in user terms
    raw: str
    input_name: str = ""
    dim: Optional[int] = None  # None: a Python scalar value
    old: str = ""
    new: str = ""
    kind: str = "other"  # size | stride | dtype | rank | value | other
    guard_line: Optional[tuple[str, int, str]] = None  # (file, line, fn) of a value guard


def split_recompile_payload(payload: str) -> list[str]:
    """The artifact is declared JSON but one reason is written raw."""
    text = (payload or "").strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
            if isinstance(items, list):
                return [str(i) for i in items]
        except ValueError:
            pass
    if text.startswith('"'):
        try:
            return [str(json.loads(text))]
        except ValueError:
            pass
    return [text] if text else []


def user_name(source: str, function: str = "") -> str:
    """`L['x']` -> `x`, `L['self'].lin.weight` -> `self.lin.weight`,
    `___stack0` -> a phrase naming the value carried over a graph break."""
    name = _SOURCE_RE.sub(lambda m: m.group("name"), source)
    name = re.sub(r"\[\s*'([^']+)'\s*\]", r".\1", name) if name.startswith(("self", "mod")) else name
    m = _STACK_RE.match(name)
    if m:
        line = resume_line(function)
        where = f" at line {line}" if line else ""
        return f"the intermediate value carried over the graph break{where}"
    # Inside a larger expression (`len(___stack0) == 2`): name it inline.
    return re.sub(r"___stack(\d+)", r"<value #\1 carried over the graph break>", name)


def translate_guard(raw: str, function: str = "") -> GuardFailure:
    """One recompile reason ("0/0: tensor 'x' size mismatch at index 0.
    expected 4, actual 7") in user terms ("tensor 'x' size mismatch at dim 0:
    4 -> 7"). `function` is the compiled code's name, used to explain
    resume-function locals."""
    body = _PREFIX_RE.sub("", raw, count=1)
    head = body.split("\n", 1)[0].strip()
    m = _SIZE_RE.search(head)
    if m:
        name = user_name(m.group("name"), function)
        dim = int(m.group("dim"))
        what = m.group("what")
        text = f"tensor '{name}' {what} mismatch at dim {dim}: {m.group('old').strip()} -> {m.group('new')}"
        return GuardFailure(text, raw, name, dim, m.group("old").strip(), m.group("new"), kind=what)
    m = _DTYPE_RE.search(head)
    if m:
        name = user_name(m.group("name"), function)
        old, new = _DTYPES.get(m.group("old"), m.group("old")), _DTYPES.get(m.group("new"), m.group("new"))
        return GuardFailure(f"tensor '{name}' dtype changed: {old} -> {new}", raw, name, None, old, new, kind="dtype")
    m = _NDIM_RE.search(head)
    if m:
        name = user_name(m.group("name"), function)
        return GuardFailure(
            f"tensor '{name}' number of dims changed: {m.group('old')} -> {m.group('new')}",
            raw, name, None, m.group("old"), m.group("new"), kind="rank",
        )
    m = _TENSOR_OTHER_RE.match(head)
    if m:
        name = user_name(m.group("name"), function)
        return GuardFailure(clip(f"tensor '{name}' {m.group('rest')}"), raw, name, kind="other")
    guard_line = None
    # The "User stack trace" has the full path; the `# file:line` comment on
    # the guard line is truncated by torch to a fixed width.
    for line in body.splitlines()[1:]:
        f = _FRAME_RE.match(line)
        if f:
            guard_line = (f.group("file"), int(f.group("line")), user_function_name(f.group("fn")))
    g = _GUARD_AT_RE.search(head)
    if g and guard_line is None:
        guard_line = (g.group("file").strip(), int(g.group("line")), user_function_name(g.group("fn")))
    if head.startswith("GLOBAL_STATE changed"):
        what = head.split(":", 1)[-1].strip()
        if "autocast" in what:
            return GuardFailure(clip(f"autocast was switched between calls ({what})"), raw, kind="autocast")
        if "grad" in what:
            return GuardFailure(clip(f"grad mode changed between calls ({what})"), raw, kind="grad_mode")
        return GuardFailure(clip(f"global torch state changed between calls ({what})"), raw, kind="global_state")
    m = _VALUE_RE.match(head)
    if m and ("___" not in m.group("lhs") or _STACK_RE.match(m.group("lhs"))):
        name = user_name(m.group("lhs"), function)
        value = short_value(guard_value(head) or m.group("value"))
        where = f" (guarded at {make_location(guard_line[0], guard_line[1]).label()})" if guard_line else ""
        if name.startswith("the intermediate"):
            return GuardFailure(
                f"{name} changed: the code after the break was specialized to its value {value}",
                raw, name, None, value, "", kind="stack_value", guard_line=guard_line,
            )
        if m.group("lhs").startswith("G["):  # a module global the compiled code reads (and often changes)
            return GuardFailure(
                f"global '{name}' changed: the code was specialized to {name} == {value}{where}",
                raw, name, None, value, "", kind="global_value", guard_line=guard_line,
            )
        kind = "value" if _is_number(value) else "object_value"
        return GuardFailure(
            f"value of '{name}' changed: the code was specialized to {name} == {value}{where}",
            raw, name, None, value, "", kind=kind, guard_line=guard_line,
        )
    expr = head.split("#", 1)[0].strip()
    return GuardFailure(f"guard failed: {clip(user_name(expr, function))}", raw, kind="other", guard_line=guard_line)


def _is_number(value: str) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return value in ("True", "False")
