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

from fuselens.capture.frames import make_location, resume_line, traceback_frame, user_function_name
from fuselens.capture.guardtext import clip, guard_value, short_value

_GB_ID_RE = re.compile(r"/gb/gb(?P<id>\d+)\.html")
_AT_RE = re.compile(r"^Graph break in user code at (?P<file>.+):(?P<line>\d+)\s*$")


@dataclass
class ParsedGraphBreak:
    reason: str = ""
    gb_type: str = ""
    explanation: str = ""
    hints: list[str] = field(default_factory=list)
    registry_id: str = ""
    # Dynamo's "Developer debug context" (first lines): names what it could not trace, such as
    # the logger method (`method: <Logger transformers.modeling_utils (WARNING)>.warning_once`)
    debug_context: str = ""
    at: Optional[tuple[str, int]] = None  # "Graph break in user code at FILE:LINE"
    frames: list[tuple[str, int, str]] = field(default_factory=list)  # user code traceback, outermost first


def parse_graph_break(text: str) -> ParsedGraphBreak:
    """Parse the `dynamo_graph_break_reason` artifact (see RECIPES.md).

    Layout (torch 2.11-2.13): "Graph break in user code at F:L", then
    "Graph Break Reason: <reason>" possibly followed by a registry title
    line, indented "Explanation:" / "Hint:" blocks, a "Developer debug
    context:" block, a gbNNNN link, "User code traceback:" with `File ...`
    frames, then Dynamo's own traceback (ignored)."""
    reader = _GraphBreakReader()
    for raw in text.splitlines():
        if not reader.read(raw):
            break
    return reader.finish()


@dataclass
class _GraphBreakReader:
    """Reads the artifact a line at a time; `section` is the block being read."""

    out: ParsedGraphBreak = field(default_factory=ParsedGraphBreak)
    section: str = "head"
    reason_lines: list[str] = field(default_factory=list)
    current: Optional[list[str]] = None  # lines of the explanation/hint being read

    def read(self, raw: str) -> bool:
        """Take one line; False once Dynamo's own traceback begins."""
        if self.section == "traceback":
            frame = traceback_frame(raw)
            if frame is not None:
                self.out.frames.append(frame)
                return True
            return not raw.strip().startswith("Traceback (most recent call last)")
        self._read_text(raw.strip())
        return True

    def _read_text(self, line: str) -> None:
        out = self.out
        m = _AT_RE.match(line)
        if m and out.at is None:
            out.at = (m.group("file"), int(m.group("line")))
        elif line.startswith("Graph Break Reason:"):
            self.section = "reason"
            self.reason_lines.append(line[len("Graph Break Reason:") :].strip())
        elif line.startswith("User code traceback:"):
            self.section = "traceback"
        elif gid := _GB_ID_RE.search(line):
            out.registry_id = f"GB{gid.group('id')}"
        elif line.startswith("Explanation:"):
            self.current = [line[len("Explanation:") :].strip()]
            out.explanation = ""
            self.section = "explanation"
        elif line.startswith("Hint:"):
            self._close()
            self.current = [line[len("Hint:") :].strip()]
            out.hints.append("")
            self.section = "hint"
        elif line.startswith("Developer debug context:"):
            self._close()
            self.section, self.current = "debug", None
            out.debug_context = line[len("Developer debug context:") :].strip()[:500]
        elif self.section == "reason":
            self.reason_lines.append(line)
        elif self.section in ("explanation", "hint") and self.current is not None:
            self.current.append(line)

    def _close(self) -> None:
        """Store the explanation or hint read so far."""
        if self.current is None:
            return
        if self.section == "explanation":
            self.out.explanation = _join(self.current)
        elif self.section == "hint" and self.out.hints:
            self.out.hints[-1] = _join(self.current)

    def finish(self) -> ParsedGraphBreak:
        if self.section in ("explanation", "hint"):
            self._close()
        # The reason is either one line, or "Encountered graph break when
        # attempting to trace X:" followed by the registry title (gb_type).
        reason_lines = [r for r in self.reason_lines if r]
        if reason_lines:
            self.out.reason = self.out.gb_type = reason_lines[0]
            if len(reason_lines) > 1:
                self.out.gb_type = reason_lines[1]
                if self.out.reason.startswith("Encountered graph break when attempting to trace"):
                    self.out.reason = reason_lines[1]
        return self.out


def _join(lines: list[str]) -> str:
    return "\n".join(l for l in lines).strip()


# ---------------------------------------------------------------- recompiles

_PREFIX_RE = re.compile(r"^\s*(?P<cid>\d+/\d+):\s*")
_SIZE_RE = re.compile(
    r"tensor '(?P<name>.+?)' (?P<what>size|stride) mismatch at index (?P<dim>\d+)\. expected (?P<old>[^,]+), actual (?P<new>\S+)"
)
_DTYPE_RE = re.compile(r"tensor '(?P<name>.+?)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)")
_NDIM_RE = re.compile(r"tensor '(?P<name>.+?)' rank mismatch\. expected (?P<old>\d+), actual (?P<new>\d+)")
_TENSOR_OTHER_RE = re.compile(r"tensor '(?P<name>[^']+)' (?P<rest>.+)")
_NONE_RE = re.compile(r"^(?P<lhs>[\w\[\]'\".]+)\s+is\s+(?P<neg>not\s+)?None\b")
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
    tensor = _tensor_guard(head, raw, function)
    if tensor is not None:
        return tensor
    if head.startswith("GLOBAL_STATE changed"):
        return _global_state_guard(head, raw)
    guard_line = _guard_line(body, head)
    m = _VALUE_RE.match(head)
    if m and ("___" not in m.group("lhs") or _STACK_RE.match(m.group("lhs"))):
        return _value_guard(m, head, raw, function, guard_line)
    n = _NONE_RE.match(head)
    if n and "___" not in n.group("lhs"):
        return _none_guard(n, raw, function, guard_line)
    expr = head.split("#", 1)[0].strip()
    return GuardFailure(f"guard failed: {clip(user_name(expr, function))}", raw, kind="other", guard_line=guard_line)


def _guarded_at(guard_line: Optional[tuple[str, int, str]]) -> str:
    """' (guarded at FILE:LINE)' for a guard whose place Dynamo gave, else ''."""
    return f" (guarded at {make_location(guard_line[0], guard_line[1]).label()})" if guard_line else ""


def _none_guard(m: re.Match, raw: str, function: str, guard_line: Optional[tuple[str, int, str]]) -> GuardFailure:
    """`x is None` (or `is not None`) no longer holds: something set x (or cleared it) after the
    call that compiled, often the compiled code itself on its first call."""
    name = user_name(m.group("lhs"), function)
    was = "not None" if m.group("neg") else "None"
    now = "is now None" if m.group("neg") else "is no longer None"
    where = _guarded_at(guard_line)
    return GuardFailure(clip(f"'{name}' {now}: the code was specialized to {name} being {was}{where}"),
                        raw, name, None, was, "", kind="none_check", guard_line=guard_line)


def _tensor_guard(head: str, raw: str, function: str) -> Optional[GuardFailure]:
    """A guard on a tensor's size, stride, dtype, rank or other property."""
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
    return None


def _global_state_guard(head: str, raw: str) -> GuardFailure:
    """Autocast, grad mode or other global torch state changed."""
    what = head.split(":", 1)[-1].strip()
    if "autocast" in what:
        return GuardFailure(clip(f"autocast was switched between calls ({what})"), raw, kind="autocast")
    if "grad" in what:
        return GuardFailure(clip(f"grad mode changed between calls ({what})"), raw, kind="grad_mode")
    return GuardFailure(clip(f"global torch state changed between calls ({what})"), raw, kind="global_state")


def _guard_line(body: str, head: str) -> Optional[tuple[str, int, str]]:
    """(file, line, function) of the user code that installed the guard."""
    guard_line = None
    # The "User stack trace" has the full path; the `# file:line` comment on
    # the guard line is truncated by torch to a fixed width.
    for line in body.splitlines()[1:]:
        frame = traceback_frame(line)
        if frame is not None:
            guard_line = (frame[0], frame[1], user_function_name(frame[2]))
    g = _GUARD_AT_RE.search(head)
    if g and guard_line is None:
        guard_line = (g.group("file").strip(), int(g.group("line")), user_function_name(g.group("fn")))
    return guard_line


def _value_guard(
    m: re.Match, head: str, raw: str, function: str, guard_line: Optional[tuple[str, int, str]]
) -> GuardFailure:
    """`lhs == value`: the code was specialized to a local's, a global's or a
    value carried over a graph break."""
    name = user_name(m.group("lhs"), function)
    value = short_value(guard_value(head) or m.group("value"))
    where = _guarded_at(guard_line)
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


def _is_number(value: str) -> bool:
    try:
        float(value)
        return True
    except ValueError:
        return value in ("True", "False")
