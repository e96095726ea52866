"""The Markdown view (GitHub-flavoured): the terminal report's content as a
document for a PR comment, a CI job summary or a wiki page.

Every piece of text from the program or from torch is escaped; Dynamo's
`backtick` code spans are kept as code spans.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional, Sequence, TypeVar

from fuselens import present
from fuselens.events import CompiledGraph, ErrorEntry, FixAdvice, Kernel, Report, SourceLocation
from fuselens.report import charts, common

MAX_NODE_ROWS = 200
_CODE_SPAN = re.compile(r"(`[^`\n]+`)")
# Enough for text to render literally inline: emphasis, code, links, HTML,
# table cells, strikethrough. (`#`, `+`, `-` only matter at a line start,
# and escaped text never starts a line here.)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
_Item = TypeVar("_Item")


def render_markdown(report: Report, *, root: Optional[str] = None) -> str:
    """The report as GitHub-flavoured Markdown."""
    report = common.bounded(report)
    out: list[str] = []
    _header(out, report, root)
    _errors(out, report, root)
    _notes(out, report, root)
    _graph_breaks(out, report, root)
    _recompiles(out, report, root)
    _graphs(out, report, root)
    _kernels(out, report, root)
    _fusion(out, report, root)
    _phases(out, report)
    _program_output(out, report)
    return "\n".join(out).rstrip() + "\n"


# -- escaping -----------------------------------------------------------
def esc(text: str) -> str:
    """Plain text that renders literally (one line)."""
    return _escape_inline(" ".join(str(text).split()))


def _escape_inline(text: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", text)


def prose(text: str) -> str:
    """Text from torch: escaped, but its `code spans` stay code."""
    parts = _CODE_SPAN.split(" ".join(str(text).split()))
    return "".join(code(p[1:-1]) if _CODE_SPAN.fullmatch(p) else _escape_inline(p) for p in parts)


def code(text: str) -> str:
    """An inline code span that survives backticks and table pipes."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def block(text: str, lang: str = "") -> list[str]:
    """A fenced code block, fence longer than any backtick run inside."""
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    fence = "`" * (longest + 1)
    return [f"{fence}{lang}", *text.rstrip("\n").splitlines(), fence]


def cell(text: str) -> str:
    """A table cell: one line, pipes escaped."""
    return esc(text) if text else " "


def table(head: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def where(loc: Optional[SourceLocation], root: Optional[str]) -> str:
    label = present.location_label(loc, root)
    return code(label) if label else "*unknown location*"


def details(summary: str, body: list[str]) -> list[str]:
    # A blank line after <summary> lets GitHub render Markdown inside.
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


# -- sections -----------------------------------------------------------
def _section(out: list[str], title: str, items: Sequence[_Item], count: str = "") -> Sequence[_Item]:
    """Opens the section `## title (count)` (count: how many items) when there are items;
    returns the items, to write under it."""
    if items:
        out += [f"## {title} ({count or len(items)})", ""]
    return items


def _header(out: list[str], report: Report, root: Optional[str]) -> None:
    run = report.run
    out.append(f"# fuselens report: {code(' '.join([present.display_path(run.target, root), *run.args]))}")
    out.append("")
    out += [" · ".join(esc(f) for f in common.run_facts(report)), ""]
    c = common.counts(report)
    out.append(
        f"**Summary:** {esc(common.summary_line(report))} · {common.plural(c.graphs, 'compiled graph')} · "
        f"{common.plural(c.kernels, 'kernel')} · {c.fused} fused / {c.not_fused} not fused"
    )
    out.append("")


def _errors(out: list[str], report: Report, root: Optional[str]) -> None:
    """Only a failed program or diverged ranks; fallbacks are in _notes."""
    errors = common.failures(report)
    _error_section(out, "Errors", common.errors_detail(errors), [(e, f"error: {e.kind}") for e in errors], root)


def _notes(out: list[str], report: Report, root: Optional[str]) -> None:
    notes = common.notes(report)
    labelled = [(e, f"warning: {common.note_category(e)}") for e in notes]
    _error_section(out, "Fallbacks", common.NOTES_DETAIL, labelled, root)


def _error_section(
    out: list[str], title: str, detail: str, labelled: list[tuple[ErrorEntry, str]], root: Optional[str]
) -> None:
    """A section of errors, each under its level ("error: exception"); none when empty."""
    if _section(out, title, labelled):
        out += [f"*{esc(detail)}*", ""]
    for err, level in labelled:
        _entry(out, err, level, root)


def _fix_items(fixes: list[FixAdvice]) -> list[str]:
    items = []
    for f in fixes:
        label, text = common.fix_label(f)
        items.append(f"- **{label}:** {prose(text)}")
        if f.detail:
            items.append(f"  - because: {prose(f.detail)}")
    return items


def _entry(out: list[str], err: ErrorEntry, level: str, root: Optional[str]) -> None:
    first = err.message.splitlines()[0] if err.message else ""
    out += [f"### {where(err.location, root)} {esc(level)}", "", f"> {esc(first)}", ""]
    if err.location and err.location.code:
        out += block(err.location.code, "python") + [""]
    if err.location and err.location.function:
        out += [f"- **in:** {code(err.location.function)}"]
    if err.compile_id:
        out += [f"- **compile:** {esc(err.compile_id)}"]
    if err.explained:
        out += [f"- **why:** {prose(err.explained)}"]
    out.append("")
    if err.traceback:
        out += details("Traceback", block(err.traceback))


def _graph_breaks(out: list[str], report: Report, root: Optional[str]) -> None:
    breaks = sorted(common.program_breaks(report), key=lambda g: -g.count)
    hits = common.break_hits(breaks)
    for gb in _section(out, "Graph breaks", breaks, f"{len(breaks)}, {common.plural(hits, 'hit')}"):
        count = f" ×{gb.count}" if gb.count > 1 else ""
        rid = f" [{esc(gb.registry_id)}]({common.gb_doc_url(gb)})" if gb.registry_id else ""
        out += [f"### {where(gb.location, root)} {prose(gb.explained or gb.reason)}{count}{rid}", ""]
        if gb.location.code:
            out += block(gb.location.code, "python") + [""]
        items = []
        if gb.location.function:
            items.append(f"- **in:** {code(gb.location.function)}" + (f", compile {esc(gb.compile_id)}" if gb.compile_id else ""))
        if gb.explained:
            items.append(f"- **torch says:** {prose(gb.reason)}")
        if gb.gb_type and gb.gb_type != gb.reason:
            items.append(f"- **type:** {prose(gb.gb_type)}")
        items += _fix_items(gb.fixes)
        if gb.explanation:
            items.append(f"- **why:** {prose(gb.explanation)}")
        items += [f"- **hint:** {prose(h)}" for h in gb.hints]
        if len(gb.user_stack) > 1:
            items.append("- **called from:** " + " ← ".join(where(s, root) for s in reversed(gb.user_stack[:-1])))
        out += items + [""]


def _recompiles(out: list[str], report: Report, root: Optional[str]) -> None:
    for rc in _section(out, "Recompiles", report.recompiles):
        kind = "hit the recompile limit" if rc.hit_limit else "recompiled"
        out += [f"### {where(rc.location, root)} {code(rc.function)} {kind} (compile {esc(rc.compile_id)})", ""]
        items = [f"- **guard failed:** {prose(r)}" for r in rc.reasons]
        if rc.call_site is not None:
            items.append(f"- **called at:** {where(rc.call_site, root)}")
        items += [f"- **changed:** {esc(common.shape_change_text(sc))}" for sc in rc.shape_changes]
        items += [f"- **dtype:** {esc(d)}" for d in rc.dtype_changes]
        if rc.hit_limit:
            items.append(f"- **limit:** {present.RECOMPILE_LIMIT}")
        items += _fix_items(rc.fixes)
        if rc.fix and not rc.fixes:
            items.append(f"- **fix:** {prose(rc.fix)}")
        items += [f"- **torch says:** {code(r)}" for r in rc.raw_reasons]
        out += items + [""]


def _graphs(out: list[str], report: Report, root: Optional[str]) -> None:
    for g in _section(out, "Compiled graphs", report.graphs):
        out += [f"### {esc(common.graph_title(g))}", ""]
        out += [f"{where(g.location, root)} · backend {esc(g.backend)} · {common.plural(len(g.ops), 'op')}", ""]
        out += [f"**ops:** {', '.join(code(o) for o in g.ops) or '*none*'}", ""]
        if g.nodes:
            out += details(f"FX graph ({common.plural(len(g.nodes), 'node')})", _graph_table(g, root))


def _graph_table(g: CompiledGraph, root: Optional[str]) -> list[str]:
    rows = []
    for n in g.nodes[:MAX_NODE_ROWS]:
        line = present.location_label(n.location, root) if n.location else ""
        rows.append([code(n.name), cell(n.op), code(n.target), code(n.kernel) if n.kernel else " ",
                     cell(n.shape), code(line) if line else " "])
    lines = table(["node", "op", "target", "kernel", "shape", "user line"], rows)
    if len(g.nodes) > MAX_NODE_ROWS:
        lines.insert(-1, f"*... and {len(g.nodes) - MAX_NODE_ROWS} more nodes*")
    return lines


def _kernels(out: list[str], report: Report, root: Optional[str]) -> None:
    if not _section(out, "Kernels", report.kernels):
        return
    total = common.kernel_time_us(report)
    if total:
        out += [f"{present.duration_us(total)} of kernel time in total.", ""]
    timed = common.kernels_by_time(report)
    order = timed + [k for k in report.kernels if k not in timed]
    rows = [[code(k.name), cell(k.graph_id.split(":")[0]), cell(k.kind), cell(k.device), str(k.calls or "-"),
             present.duration_us(k.total_time_us) if k.total_time_us else "-",
             ", ".join(code(o) for o in k.ops) or " ",
             ", ".join(code(present.location_label(s, root)) for s in k.source_lines) or " "] for k in order]
    out += table(["kernel", "compile", "kind", "device", "calls", "time", "fused ops", "user lines"], rows)
    for k in order:
        if k.source:
            out += details(f"<code>{_html(k.name)}</code> source", block(k.source, _lang(k)))


def _fusion(out: list[str], report: Report, root: Optional[str]) -> None:
    c = common.counts(report)
    if not _section(out, "Fusion decisions", report.fusion, f"{c.fused} fused, {c.not_fused} not fused"):
        return
    order = [d for d in report.fusion if d.decision == "not_fused"] + [d for d in report.fusion if d.decision == "fused"]
    rows = [["**not fused**" if d.decision == "not_fused" else "fused",
             ", ".join(code(n) for n in d.nodes), code(d.kernel) if d.kernel else " ", cell(d.rule),
             cell(d.reason), code(d.option) if d.option else " ",
             ", ".join(code(present.location_label(x, root)) for x in d.locations) or " "] for d in order]
    out += table(["decision", "nodes", "kernel", "rule", "reason", "to change it", "user lines"], rows)


def _phases(out: list[str], report: Report) -> None:
    phases = charts.phase_rows(report)
    if not _section(out, "Compile time per phase", phases, present.duration_s(common.compile_seconds(report))):
        return
    total = common.compile_seconds(report) or 1.0
    # Nested phases lie inside their parent: indent them, never add them up.
    rows = [[("&nbsp;&nbsp;" * depth + ("└ " if depth else "")) + esc(name), present.duration_s(s), f"{100 * s / total:.0f}%"]
            for name, s, depth in phases]
    out += table(["phase", "time", "share"], rows)


def _program_output(out: list[str], report: Report) -> None:
    for name, text in (("stdout", report.run.stdout_tail), ("stderr", report.run.stderr_tail)):
        if text.strip():
            out += details(f"Program {name} (tail)", block(text))


def _lang(k: Kernel) -> str:
    return {"cpp": "cpp", "python": "python"}.get(k.language, "")


def _html(text: str) -> str:
    import html

    return html.escape(text)
