"""Report -> LSP diagnostics. Pure: no server, no I/O beyond the resolver.

Every diagnostic has `source: "fuselens"` and one of the stable codes below;
a `Finding` keeps the diagnostic together with the event it shows, from which
a code action builds a fix later (against the document text current at that
time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from lsprotocol import types

from fuselens import present
from fuselens.events import (
    ErrorEntry,
    FusionDecision,
    GraphBreak,
    Kernel,
    Recompile,
    Report,
    SourceLocation,
)
from fuselens.server.resolve import Resolver

SOURCE = "fuselens"
GRAPH_BREAK = "graph-break"
RECOMPILE = "recompile"
RECOMPILE_LIMIT = "recompile-limit"
FUSED = "fused"
FUSION_BLOCKED = "fusion-blocked"
FALLBACK = "fallback"
ERROR = "error"

GB_SITE = "https://meta-pytorch.github.io/compile-graph-break-site/gb/"
COND_DOC = "https://pytorch.org/docs/stable/generated/torch.cond.html"

DATA_DEPENDENT_HINT = (
    "Hint: Dynamo cannot trace an `if` on a tensor's value. Compute both results and pick "
    "with torch.where(pred, a, b), or use torch.cond(pred, true_fn, false_fn, operands) "
    f"({COND_DOC})."
)


# What a diagnostic shows: the schema's own record (fused findings of Inductor's
# kernels have no FusionDecision: their Kernel).
FindingEvent = Union[GraphBreak, Recompile, ErrorEntry, FusionDecision, Kernel]


@dataclass
class Finding:
    uri: str
    line: int  # 0-based, in the document `uri`
    code: str
    diagnostic: types.Diagnostic
    event: FindingEvent  # input of fixes.fixes_for


def report_findings(report: Report, resolver: Resolver) -> dict[str, list[Finding]]:
    """All findings of a report, by document URI, sorted by line."""
    findings: list[Finding] = []
    findings += _graph_breaks(report.graph_breaks, resolver)
    findings += _recompiles(report.recompiles, resolver)
    findings += _errors(report.errors, resolver)
    findings += _fusion(report, resolver)
    by_uri: dict[str, list[Finding]] = {}
    for f in findings:
        by_uri.setdefault(f.uri, []).append(f)
    for items in by_uri.values():
        items.sort(key=lambda f: (f.line, f.code))
    return by_uri


def _diagnostic(
    resolver: Resolver,
    uri: str,
    line: int,
    code: str,
    severity: types.DiagnosticSeverity,
    message: str,
    related: Optional[list[types.DiagnosticRelatedInformation]] = None,
    href: str = "",
) -> types.Diagnostic:
    return types.Diagnostic(
        range=resolver.line_range(uri, line),
        message=message,
        severity=severity,
        code=code,
        code_description=types.CodeDescription(href=href) if href else None,
        source=SOURCE,
        related_information=related or None,
    )


def _related(resolver: Resolver, stack: Iterable[SourceLocation], note: str = "") -> list[types.DiagnosticRelatedInformation]:
    out = []
    for frame in stack:
        place = resolver.location(frame)
        if place is not None:
            label = f"in {frame.function}" if frame.function else "here"
            out.append(types.DiagnosticRelatedInformation(location=place, message=f"{note}{label}: {frame.code}".rstrip(": ")))
    return out


def _graph_breaks(breaks: list[GraphBreak], resolver: Resolver) -> list[Finding]:
    out = []
    for gb in breaks:
        if gb.origin:  # inside DistributedDataParallel's own wrapper: by design, nothing to fix
            continue
        where = resolver.locate(gb.location) or _innermost(gb.user_stack, resolver)
        if where is None:
            continue
        uri, line = where
        lines = [f"Graph break: {gb.reason}" + (f" (x{gb.count})" if gb.count > 1 else "")]
        if gb.explained:
            # the catalogue's reading in the user's terms, and its best fix; torch's own hint is
            # left out then (a backend's failure: "report an issue to the backend compiler repo",
            # where the cause is the program's custom op)
            lines.append(gb.explained)
            best = next((f for f in gb.fixes if f.preferred), gb.fixes[0] if gb.fixes else None)
            if best is not None:
                lines.append(f"Fix: {best.title}" + (" (verified)" if best.verified else ""))
        else:
            if gb.explanation and gb.explanation not in gb.reason:
                lines.append(gb.explanation)
            lines += [h if h.lower().startswith("hint") else f"Hint: {h}" for h in gb.hints]
        if is_data_dependent(gb) and not gb.hints:
            lines.append(DATA_DEPENDENT_HINT)
        lines += _on_ranks(gb.ranks)
        href = f"{GB_SITE}{gb.registry_id.lower()}.html" if gb.registry_id else ""
        diag = _diagnostic(
            resolver, uri, line, GRAPH_BREAK, types.DiagnosticSeverity.Warning,
            "\n".join(lines), _related(resolver, gb.user_stack), href,
        )
        out.append(Finding(uri, line, GRAPH_BREAK, diag, gb))
    return out


def _on_ranks(ranks: list[int]) -> list[str]:
    """`On ranks 0-1.` for a finding of a torchrun run (a single process's
    findings have no ranks)."""
    if not ranks:
        return []
    from fuselens.report.ranks_view import ranks_label  # only torchrun runs need it

    return [f"On {ranks_label(ranks)}."]


def _innermost(stack: list[SourceLocation], resolver: Resolver) -> Optional[tuple[str, int]]:
    for frame in reversed(stack):
        where = resolver.locate(frame)
        if where is not None:
            return where
    return None


def is_data_dependent(gb: GraphBreak) -> bool:
    text = f"{gb.reason} {gb.gb_type}".lower()
    return "data-dependent branch" in text or "generic_jump" in text or gb.registry_id in ("GB0170", "GB0035")


def _recompiles(recompiles: list[Recompile], resolver: Resolver) -> list[Finding]:
    out = []
    for rc in recompiles:
        where = resolver.locate(rc.location)
        if where is None:
            continue
        uri, line = where
        code = RECOMPILE_LIMIT if rc.hit_limit else RECOMPILE
        reasons = rc.reasons or rc.raw_reasons
        head = (
            f"Recompile limit reached for {rc.function or 'this function'}: Dynamo gave up and runs it eagerly"
            if rc.hit_limit
            else f"Recompile of {rc.function or 'this function'} ({rc.compile_id})"
        )
        lines = [head + (": " + "; ".join(reasons) if reasons else "")]
        for change in rc.shape_changes:
            what = change.input_name if change.dim is None else f"{change.input_name}.size({change.dim})"
            lines.append(f"{what} changed {change.old} -> {change.new}" + (" (now dynamic)" if change.became_dynamic else ""))
        lines += [f"dtype: {d}" for d in rc.dtype_changes]
        if rc.fix:
            lines.append(f"Fix: {rc.fix}")
        lines += _on_ranks(rc.ranks)
        severity = types.DiagnosticSeverity.Warning
        diag = _diagnostic(resolver, uri, line, code, severity, "\n".join(lines))
        out.append(Finding(uri, line, code, diag, rc))
    return out


_ERROR_TITLES = {
    "exception": "The program raised",
    "exit": "The program exited with an error",
    "syntax": "Syntax error",
    "timeout": "The program timed out",
    "killed": "The program was killed",
    "compile": "A compiled graph fell back to eager",
    "fallback": "Fallback",  # an op in ATen, a graph without CUDA graphs: not eager
    "internal": "fuselens failed (please report)",
    "divergence": "The ranks diverged (the job can deadlock)",
}


def _errors(errors: list[ErrorEntry], resolver: Resolver) -> list[Finding]:
    out = []
    for err in errors:
        where = resolver.locate(err.location) or ((resolver.default_uri, 0) if resolver.default_uri else None)
        if where is None:
            continue
        uri, line = where
        fallback = err.kind in ("fallback", "compile")
        code = FALLBACK if fallback else ERROR
        severity = types.DiagnosticSeverity.Warning if fallback else types.DiagnosticSeverity.Error
        message = f"{_ERROR_TITLES.get(err.kind, err.kind)}: {err.message}".strip()
        if err.kind != "divergence":  # its message names its ranks already
            message = "\n".join([message, *_on_ranks(err.ranks)])
        tail = _traceback_tail(err.traceback)
        if tail and tail not in message:
            message += "\n" + tail
        diag = _diagnostic(resolver, uri, line, code, severity, message)
        out.append(Finding(uri, line, code, diag, err))
    return out


def _traceback_tail(tb: str, lines: int = 6) -> str:
    return "\n".join(tb.strip().splitlines()[-lines:]) if tb else ""


# ---- fusion ---------------------------------------------------------------

_INDUCTOR_NAME = re.compile(r"_fused_(.+?)_\d+$")


def kernel_ops(kernel: Kernel) -> list[str]:
    """The ops of a kernel; for Inductor kernels without recorded ops, read
    them off the name (`triton_poi_fused_add_cos_mul_sin_0`)."""
    if kernel.ops:
        return [present.short_op(op) for op in kernel.ops]
    match = _INDUCTOR_NAME.search(kernel.name)
    return match.group(1).split("_") if match else []


def node_locations(report: Report) -> dict[tuple[str, str], SourceLocation]:
    """(graph_id, node name) -> user location, from the compiled graphs."""
    out = {}
    for graph in report.graphs:
        gid = graph.graph_id or f"{graph.compile_id}:{graph.stage}"
        for node in graph.nodes:
            if node.location is not None:
                out[(gid, node.name)] = node.location
    return out


def kernel_locations(kernel: Kernel, nodes: dict[tuple[str, str], SourceLocation]) -> list[SourceLocation]:
    """Where a kernel's ops came from: its own source lines, else its nodes'."""
    if kernel.source_lines:
        return list(kernel.source_lines)
    return [nodes[(kernel.graph_id, n)] for n in kernel.nodes if (kernel.graph_id, n) in nodes]


def kernel_lines(report: Report, resolver: Resolver) -> dict[tuple[str, int], list[Kernel]]:
    """(uri, line) -> kernels that computed ops of that line (hover, inlay hints)."""
    nodes = node_locations(report)
    out: dict[tuple[str, int], list[Kernel]] = {}
    for kernel in report.kernels:
        for loc in kernel_locations(kernel, nodes):
            where = resolver.locate(loc)
            if where is not None and kernel not in out.setdefault(where, []):
                out[where].append(kernel)
    return out


def _fusion(report: Report, resolver: Resolver) -> list[Finding]:
    out: list[Finding] = []
    seen: set[tuple[str, int, str]] = set()
    nodes = node_locations(report)
    for kernel in report.kernels:
        if kernel.kind == "extern":
            continue
        ops = kernel_ops(kernel)
        places = _unique_places(kernel_locations(kernel, nodes), resolver)
        if len(ops) < 2 and len(places) < 2:
            continue  # one op alone: nothing was fused
        out += _fused_findings(resolver, kernel, kernel.name, ops, places, seen)
    for decision in report.fusion:
        places = _unique_places(decision.locations, resolver)
        if decision.decision == "fused" and decision.kernel:
            out += _fused_findings(resolver, decision, decision.kernel, decision.nodes, places, seen)
        elif decision.decision == "not_fused" and places:
            out += _blocked_findings(resolver, decision, places)
    return out


def _unique_places(locs: Iterable[SourceLocation], resolver: Resolver) -> list[tuple[str, int]]:
    places: list[tuple[str, int]] = []
    for loc in locs:
        where = resolver.locate(loc)
        if where is not None and where not in places:
            places.append(where)
    return places


def _fused_findings(resolver, event: Union[Kernel, FusionDecision], name, ops, places, seen) -> list[Finding]:
    out = []
    line_list = ", ".join(str(line + 1) for _, line in places)
    what = ", ".join(ops) if ops else "its ops"
    for uri, line in places:
        if (uri, line, name) in seen:
            continue
        seen.add((uri, line, name))
        message = f"Fused into kernel {name}: {what}" + (f" (lines {line_list})" if len(places) > 1 else "")
        diag = _diagnostic(resolver, uri, line, FUSED, types.DiagnosticSeverity.Hint, message)
        out.append(Finding(uri, line, FUSED, diag, event))
    return out


def _blocked_findings(resolver: Resolver, decision: FusionDecision, places) -> list[Finding]:
    out = []
    pair = " and ".join(decision.nodes) if decision.nodes else "these ops"
    message = f"Not fused: {pair} share data but stayed in separate kernels: {decision.reason}"
    if decision.rule:
        message += f" [rule: {decision.rule}]"
    if decision.option:
        message += f"\nOption that would fuse them: {decision.option}"
    related = [
        types.DiagnosticRelatedInformation(location=types.Location(uri=u, range=resolver.line_range(u, l)), message="other side")
        for u, l in places[1:]
    ]
    uri, line = places[0]
    diag = _diagnostic(resolver, uri, line, FUSION_BLOCKED, types.DiagnosticSeverity.Information, message, related)
    out.append(Finding(uri, line, FUSION_BLOCKED, diag, decision))
    return out
