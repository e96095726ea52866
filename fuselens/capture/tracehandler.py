"""Turn torch's structured trace into schema events (worker side).

A `logging.Handler` on `torch.__trace` receives every structured record:
`record.metadata` (a dict whose first key names the record, plus
`frame_id`/`frame_compile_id`/`attempt`) and `record.payload` (str or None).
File names are interned by `{"str": [path, id]}` records (RECIPES.md).

Records read here: str, dynamo_start, compilation_metrics, artifact
`dynamo_graph_break_reason`, artifact `recompile_reasons`, artifact
`inductor_output_code`, chromium events `automatic_dynamic` and
`pgo.dynamic_whitelist`, `symbolic_shape_specialization`. Recompiles are
held until their compile's `compilation_metrics` (which names the compiled
function and says whether the recompile limit was hit).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from fuselens import fixcatalog
from fuselens.capture import backend_failure, callsite, fsdp, guardtext
from fuselens.capture import frames as fr
from fuselens.capture import tracetext
from fuselens.capture.break_origin import break_origin
from fuselens.capture.torchlog import TorchLogReader
from fuselens.events import ErrorEntry, FixAdvice, GraphBreak, PhaseTime, Recompile, ShapeChange, SourceLocation

Emit = Callable[[Any], None]

# Substrings of compilation_metrics.fail_reason meaning "recompile limit hit";
# the option was called cache_size_limit before 2.7, recompile_limit after.
_LIMIT_MARKERS = ("recompile_limit", "cache_size_limit", "recompile limit")


@dataclass
class _Pending:
    """What one compile id accumulated before its compilation_metrics."""

    raw_reasons: list[str] = field(default_factory=list)
    dynamic: dict[tuple[str, Any], dict] = field(default_factory=dict)  # (input, dim) -> automatic_dynamic args
    whitelist: set[str] = field(default_factory=set)  # inputs pgo marked dynamic
    specializations: list[str] = field(default_factory=list)
    start: Optional[tuple[str, int, str]] = None  # innermost frame of dynamo_start
    call_site: Optional[SourceLocation] = None  # the user line calling the compiled code


def _graph_break(parsed: tracetext.ParsedGraphBreak, cid: str, location: SourceLocation, reason: str,
                 stack: list[SourceLocation], origin: str = "") -> GraphBreak:
    """A finding from one `dynamo_graph_break_reason` record, at `location`."""
    return GraphBreak(location=location, reason=reason, explanation=parsed.explanation,
                      hints=[h for h in parsed.hints if h], gb_type=parsed.gb_type,
                      registry_id=parsed.registry_id, compile_id=cid, user_stack=stack, origin=origin)


def _compile_id(meta: dict) -> str:
    fid, cid = meta.get("frame_id"), meta.get("frame_compile_id")
    if fid is None or cid is None:
        return ""
    return f"{fid}/{cid}"


@dataclass
class _GuardReading:
    """What the failed guards of one recompile say, each entry once."""

    reasons: list[str] = field(default_factory=list)
    shapes: list[ShapeChange] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    fixes: list[FixAdvice] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)  # one per guard
    sizes: list[tuple[str, int]] = field(default_factory=list)  # (input, dim) of size guards on inputs


def _recompile_location(
    co_name: str, co_file: str, first: int, p: _Pending, call: Optional[callsite.CallText]
) -> tuple[SourceLocation, str]:
    """Where a recompile of code object `co_name` shows, and the function it names."""
    function = fr.user_function_name(co_name)
    if not co_file and p.start:
        co_file = p.start[0]
    # Code identity: the file and first line of the code object, never
    # its name (two `forward`s in one file are two functions).
    def_line = first
    if fr.is_generated_function(co_name):
        def_line = fr.enclosing_def_line(co_file, fr.resume_line(co_name) or first) or fr.resume_line(co_name) or first
    if co_file and fr.is_user_file(co_file):
        return fr.make_location(co_file, def_line, function), function
    if p.call_site is not None:
        # Library code was compiled (an nn.Module wrapper, transformers'
        # `wrapper`): point at the user's call and name what they called.
        return p.call_site, call.callee if call is not None else p.call_site.function or function
    location = fr.make_location(co_file, def_line, function) if co_file else SourceLocation("<unknown>", 0, function)
    return location, function


class TraceHandler(TorchLogReader):
    """Receives `torch.__trace` records and emits GraphBreak, Recompile,
    PhaseTime, ErrorEntry and (through `on_output_code`) Inductor code."""

    def __init__(self, emit: Emit, on_record: Optional[Callable[[str, dict, Optional[str]], None]] = None) -> None:
        super().__init__()
        self._emit = emit
        # Every record also goes to on_record(compile_id, metadata, payload)
        # (the Inductor kernel reader); on_metrics(compile_id) after a compile.
        self.on_record = on_record
        self.on_metrics: Optional[Callable[[str], None]] = None
        self._strings: dict[int, str] = {}
        self._pending: dict[str, _Pending] = {}
        self._seen_breaks: set[tuple] = set()
        self._break_compiles: set[str] = set()  # compile ids that logged a graph break
        # a backend's failures by the message Dynamo's records quote, read from their tracebacks;
        # where the first record of each was, and the (compile id, message) pairs reported
        self._backend_failures: dict[str, backend_failure.BackendFailure] = {}
        self._failure_at: dict[str, SourceLocation] = {}
        self._seen_failures: set[tuple[str, str]] = set()
        # (file, def line) -> [(input, dim)] of its last size recompile: the
        # input an intermediate's size comes from.
        self._last_sizes: dict[tuple[str, int], list[tuple[str, int]]] = {}
        self.frames_by_compile: dict[str, tuple[str, int, str]] = {}
        self._frame_code: dict[str, tuple[str, str, int]] = {}  # frame id -> (co_name, co_filename, firstlineno)
        self._lock = threading.RLock()

    def reset_run(self) -> None:
        """Forget per-run state (interned strings stay: torch keeps its table)."""
        with self._lock:
            self._pending.clear()
            self._seen_breaks.clear()
            self._break_compiles.clear()
            self._backend_failures.clear()
            self._failure_at.clear()
            self._seen_failures.clear()
            self._last_sizes.clear()
            self.frames_by_compile.clear()
            self._frame_code.clear()

    def read(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None)
        if not isinstance(meta, dict):
            return
        with self._lock:
            self._dispatch(meta, getattr(record, "payload", None))

    def _dispatch(self, meta: dict, payload: Optional[str]) -> None:
        if "str" in meta:
            value = meta["str"]
            if isinstance(value, (list, tuple)) and len(value) == 2:
                self._strings[int(value[1])] = str(value[0])
            return
        if "chromium_event" in meta and "automatic_dynamic" not in (payload or "") and "dynamic_whitelist" not in (payload or ""):
            return  # ~90% of all records: timing spans we do not need
        cid = _compile_id(meta)
        if "dynamo_start" in meta:
            self._on_dynamo_start(cid, meta["dynamo_start"] or {})
        elif "artifact" in meta:
            name = (meta["artifact"] or {}).get("name", "")
            if name == "dynamo_graph_break_reason":
                self._on_graph_break(cid, payload or "")
            elif name == "recompile_reasons":
                self._pending.setdefault(cid, _Pending()).raw_reasons.extend(
                    tracetext.split_recompile_payload(payload or "")
                )
        elif "chromium_event" in meta:
            self._on_chromium(cid, payload)
        elif "symbolic_shape_specialization" in meta:
            self._on_specialization(cid, meta["symbolic_shape_specialization"] or {})
        elif "compilation_metrics" in meta:
            self._on_metrics(meta["compilation_metrics"] or {})
            if self.on_metrics is not None:
                self.on_metrics(str((meta["compilation_metrics"] or {}).get("compile_id") or cid))
        if self.on_record is not None:
            self.on_record(cid, meta, payload)

    # records ---------------------------------------------------------------
    def _filename(self, value: Any) -> str:
        if isinstance(value, int):
            return self._strings.get(value, "")
        return str(value or "")

    def _on_dynamo_start(self, cid: str, start: dict) -> None:
        stack = start.get("stack") or []
        if stack:
            inner = stack[-1]
            frame = (self._filename(inner.get("filename")), int(inner.get("line") or 0), str(inner.get("name", "")))
            self.frames_by_compile[cid] = frame
            pending = self._pending.setdefault(cid, _Pending())
            pending.start = frame
            if not cid.endswith("/0"):  # a recompile: remember who called
                pending.call_site = _call_site(frame)

    def _on_graph_break(self, cid: str, text: str) -> None:
        failure = backend_failure.read_failure(text)
        if failure is not None:
            self._backend_failures[failure.message] = failure
        if text.startswith("WON'T CONVERT"):
            return  # the backend's traceback alone; its graph-break record follows
        parsed = tracetext.parse_graph_break(text)
        if parsed.gb_type == backend_failure.GB_TYPE:
            self._on_backend_failure(cid, parsed)
            return
        stack = fr.user_stack(parsed.frames)
        location = stack[-1] if stack else None
        if location is None and parsed.at is not None:
            location = fr.make_location(parsed.at[0], parsed.at[1])
        if location is None:
            location = SourceLocation(file="<unknown>", line=0)
        gb = _graph_break(parsed, cid, location, parsed.reason or "graph break", stack,
                          origin=break_origin(parsed.frames, parsed.explanation))
        key = (cid,) + gb.key()
        self._break_compiles.add(cid)
        if key in self._seen_breaks:  # a restarted attempt logs the same break again
            return
        self._seen_breaks.add(key)
        gb.explained, gb.fixes = fsdp.hook_break(parsed.frames) or fixcatalog.graph_break_fixes(gb, parsed.debug_context)
        self._emit(gb)

    def _on_backend_failure(self, cid: str, parsed: tracetext.ParsedGraphBreak) -> None:
        """One finding per backend failure: Dynamo's break repeats in every frame around
        the failing code (each frame's record reads "cannot resume" and then "skipping the
        function"), all at the user's line into the compiled code."""
        backend, message = backend_failure.failed_with(parsed.explanation)
        message = message or (parsed.explanation or parsed.reason).strip()[:200]  # another torch's wording
        if (cid, message) in self._seen_failures:
            return
        self._seen_failures.add((cid, message))
        stack = fr.user_stack(parsed.frames)
        at = self._failure_at.setdefault(message, stack[-1] if stack else SourceLocation(file="<unknown>", line=0))
        failure = self._backend_failures.get(message)
        gb = _graph_break(parsed, cid, at, f"the {backend or 'backend'} compiler failed with {message}", stack)
        self._break_compiles.add(cid)
        gb.explained, gb.fixes = fixcatalog.backend_failure_fixes(backend, failure)
        self._emit(gb)

    def _on_chromium(self, cid: str, payload: Optional[str]) -> None:
        if not payload:
            return
        try:
            event = json.loads(payload) if isinstance(payload, str) else payload
        except ValueError:
            return
        name = event.get("name")
        args = event.get("args") or {}
        if name == "automatic_dynamic":
            target = args.get("compile_id") or cid
            key = (str(args.get("name", "")), args.get("dim_changed"))
            self._pending.setdefault(target, _Pending()).dynamic[key] = args
        elif name == "pgo.dynamic_whitelist":
            target = args.get("compile_id") or cid
            names = str(args.get("recompile_dynamic_whitelist") or "")
            pending = self._pending.setdefault(target, _Pending())
            pending.whitelist.update(n.strip() for n in names.split(",") if n.strip())

    def _on_specialization(self, cid: str, spec: dict) -> None:
        sources = spec.get("sources") or []
        function = self.frames_by_compile.get(cid, ("", 0, ""))[2]
        names = ", ".join(tracetext.user_name(str(s), function) for s in sources) or str(spec.get("symbol", "?"))
        frames = [
            (self._filename(f.get("filename")), int(f.get("line") or 0), str(f.get("name", "")))
            for f in (spec.get("user_stack") or [])
            if isinstance(f, dict)
        ]
        where = fr.innermost_user(frames)
        at = f" at {where.label()}" if where else ""
        reason = spec.get("reason") or ""
        text = f"{names} was specialized to {spec.get('value')}{at}" + (f" ({reason})" if reason else "")
        self._pending.setdefault(cid, _Pending()).specializations.append(text)

    def _on_metrics(self, m: dict) -> None:
        cid = str(m.get("compile_id") or "")
        co_name = str(m.get("co_name") or "")
        co_file = str(m.get("co_filename") or "")
        first = int(m.get("co_firstlineno") or 0)
        frame_key = cid.split("/")[0]
        if co_name:
            self._frame_code[frame_key] = (co_name, co_file, first)
        elif frame_key in self._frame_code:
            # A compile that failed early (recompile limit) names no code:
            # it is the same frame as that id's earlier compiles.
            co_name, co_file, first = self._frame_code[frame_key]
        self._emit_phases(cid, m)
        pending = self._pending.pop(cid, None)
        fail_type, fail_reason = m.get("fail_type"), m.get("fail_reason")
        hit_limit = bool(fail_type) and any(k in str(fail_reason or "") for k in _LIMIT_MARKERS)
        if pending is not None and (pending.raw_reasons or hit_limit):
            self._emit_recompile(cid, co_name, co_file, first, pending, hit_limit)
        elif hit_limit:
            self._emit_recompile(cid, co_name, co_file, first, _Pending(), True)
        # A graph break that Dynamo handled by running the rest eagerly is
        # already reported as a graph break; it is not a second finding.
        if fail_type and not hit_limit and cid not in self._break_compiles:
            loc = None
            if m.get("fail_user_frame_filename") and fr.is_user_file(str(m["fail_user_frame_filename"])):
                loc = fr.make_location(str(m["fail_user_frame_filename"]), int(m.get("fail_user_frame_lineno") or 0))
            self._emit(
                ErrorEntry(
                    "compile",
                    f"{fail_type}: {str(fail_reason or '').strip().splitlines()[0] if fail_reason else ''}".strip(": "),
                    location=loc,
                    traceback=str(fail_reason or ""),
                    compile_id=cid,
                )
            )

    def _emit_phases(self, cid: str, m: dict) -> None:
        total = float(m.get("entire_frame_compile_time_s") or 0.0)
        backend = float(m.get("backend_compile_time_s") or 0.0)
        if total or backend:
            self._emit(PhaseTime("dynamo", round(max(total - backend, 0.0), 6), cid))
            self._emit(PhaseTime("backend", round(backend, 6), cid))
        # Inductor's compile lies inside the backend's, its code generation
        # inside Inductor's compile: children name their parent.
        for key, phase, parent in (
            ("inductor_compile_time_s", "inductor", "backend"),
            ("code_gen_time_s", "codegen", "inductor"),
        ):
            if m.get(key):
                self._emit(PhaseTime(phase, round(float(m[key]), 6), cid, parent=parent))

    def _emit_recompile(self, cid: str, co_name: str, co_file: str, first: int, p: _Pending, hit_limit: bool) -> None:
        call = callsite.parse_call(p.call_site.code) if p.call_site is not None else None
        location, function = _recompile_location(co_name, co_file, first, p, call)
        identity = (location.file, location.line)
        raws = guardtext.latest_entry(p.raw_reasons)
        read = _GuardReading()
        library_frame = bool(co_file) and not fr.is_user_file(co_file)
        for raw in raws:
            self._read_guard(read, tracetext.translate_guard(raw, co_name), co_name, p, call, identity, library_frame)
        if read.sizes:
            self._last_sizes[identity] = read.sizes
        reasons, fixes = read.reasons, read.fixes
        reasons.extend(s for s in p.specializations if s not in reasons)
        fix = fixes[0].title if fixes else ""
        if hit_limit:
            reasons.append(
                "recompile limit reached (torch._dynamo.config.recompile_limit): Dynamo stopped compiling this function and runs it eagerly"
            )
            fix = f"{fix}; or raise torch._dynamo.config.recompile_limit" if fix else \
                "remove the cause of the recompiles above, or raise torch._dynamo.config.recompile_limit"
        self._emit(
            Recompile(
                function=function,
                location=location,
                compile_id=cid,
                reasons=[guardtext.clip(r) for r in reasons],
                raw_reasons=[guardtext.short_guard(r) for r in raws],
                shape_changes=read.shapes,
                dtype_changes=read.dtypes,
                fix=fix,
                hit_limit=hit_limit,
                call_site=p.call_site,
                fixes=fixes,
                cause=read.causes[0] if read.causes else "",
            )
        )

    def _read_guard(
        self,
        read: _GuardReading,
        g: tracetext.GuardFailure,
        co_name: str,
        p: _Pending,
        call: Optional[callsite.CallText],
        identity: tuple[str, int],
        library_frame: bool = False,
    ) -> None:
        """Add what one failed guard says to `read`, in the user's names. In a library's frame
        (`library_frame`), an input the user's call does not pass is no name the user can mark
        dynamic (transformers' `_can_use_grouped_mm(input, weight, offs)`, compiled apart
        after a graph break, recompiled for each expert weight's shape)."""
        dynamic = self._became_dynamic(p, g)
        shown = callsite.user_argument(g.input_name, call) if g.input_name else None
        if shown:
            g.text = g.text.replace(f"'{g.input_name}'", f"'{shown}'")
            g.input_name = shown
        if g.text not in read.reasons:
            read.reasons.append(g.text)
        if g.kind in ("size", "stride", "value", "rank"):
            new = g.new
            if g.kind == "value":
                new = str((p.dynamic.get((f"L['{g.input_name}']", "scalar")) or {}).get("new", ""))
            change = ShapeChange(g.input_name, g.dim, g.old, guardtext.short_value(new), became_dynamic=dynamic)
            if change not in read.shapes:
                read.shapes.append(change)
        if g.kind == "dtype":
            entry = f"{g.input_name}: {g.old} -> {g.new}"
            if entry not in read.dtypes:
                read.dtypes.append(entry)
        intermediate = g.input_name.startswith("the intermediate") or fr.is_generated_function(co_name)
        root = ""
        if g.kind == "size" and intermediate:
            root = next((n for n, d in self._last_sizes.get(identity, []) if d == g.dim), "")
        elif g.kind == "size" and g.dim is not None:
            read.sizes.append((g.input_name, g.dim))
        for advice in fixcatalog.recompile_fixes(g.kind, g.input_name, g.dim, intermediate=intermediate, input_name=root,
                                                 value=g.old):
            if advice.edit == "mark_dynamic" and library_frame and not shown:
                continue
            if all(advice.title != f.title for f in read.fixes):
                read.fixes.append(advice)
        read.causes.append(read.fixes[0].cause if read.fixes else g.kind)

    @staticmethod
    def _became_dynamic(p: _Pending, g: tracetext.GuardFailure) -> bool:
        if not g.input_name:
            return False
        source = f"L['{g.input_name}']"
        if g.kind == "value":
            return (source, "scalar") in p.dynamic or source in p.whitelist
        return (source, g.dim) in p.dynamic or source in p.whitelist

    def flush_pending(self) -> None:
        """At the end of a run: recompiles whose metrics never came (the
        program ended or died mid-compile) are still reported."""
        with self._lock:
            for cid, p in list(self._pending.items()):
                if p.raw_reasons:
                    file, line, name = p.start or ("", 0, "")
                    self._emit_recompile(cid, name, file, line, p, False)
            self._pending.clear()


def _call_site(compiled: tuple[str, int, str]) -> Optional[SourceLocation]:
    """The user line that called the function being compiled.

    `dynamo_start` is logged synchronously on the compiling thread, whose
    Python stack still holds the caller (the compiled frame itself is not on
    it yet). The innermost user frame outside the compiled function (and
    outside its resume functions, which run inside the caller's frame) is the
    call site."""
    file, _, name = compiled
    function = fr.user_function_name(name)
    frames = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < 200:
        code = frame.f_code
        frames.append((code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    for filename, line, co_name in frames:  # innermost first
        if not fr.is_user_file(filename):
            continue
        if filename == file and fr.user_function_name(co_name) == function:
            continue  # the compiled function's own (transformed) frame
        return fr.make_location(filename, line, co_name)
    return None


def install(handler: TraceHandler) -> logging.Logger:
    """Attach `handler` to torch's trace logger (DEBUG, never propagates)."""
    logger = logging.getLogger("torch.__trace")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    return logger
