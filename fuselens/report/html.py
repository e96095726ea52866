"""The HTML view: ONE self-contained file (inline CSS and SVG, no script, no
external asset or CDN) with a summary, every finding, bar charts of compile
time per phase and kernel time per kernel, a picture of each compiled graph
(nodes coloured by the kernel they were fused into) and the generated kernel
sources in collapsible blocks.

Every string from the program or from torch goes through `escape`.
"""

from __future__ import annotations

import re
from html import escape
from typing import Callable, Optional

from fuselens import __version__, present
from fuselens.events import CompiledGraph, ErrorEntry, FixAdvice, Kernel, Report, SourceLocation
from fuselens.report import charts, common
from fuselens.report.graph_svg import GraphPicture, draw_graph
from fuselens.report.html_style import CSS

MAX_KERNEL_BARS = 25
_CODE_SPAN = re.compile(r"`([^`\n]+)`")

Drawer = Callable[[Report, CompiledGraph, Optional[str], str], GraphPicture]


def render_html(report: Report, *, root: Optional[str] = None, draw: Drawer = draw_graph) -> str:
    """The report as one HTML document. `draw` lays out graph pictures
    (graphviz by default; tests pass a drawer that reports it missing)."""
    report = common.bounded(report)
    body = [
        _header(report, root),
        _summary(report),
        _errors(report, root),
        _notes(report, root),
        _graph_breaks(report, root),
        _recompiles(report, root),
        _time_charts(report),
        _graphs(report, root, draw),
        _kernels(report, root),
        _fusion(report, root),
        _program_output(report),
        f'<footer>fuselens {escape(__version__)} · report schema v{report.schema_version}</footer>',
    ]
    title = f"fuselens report: {report.run.target}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
        + "\n".join(part for part in body if part)
        + "\n</main>\n</body>\n</html>\n"
    )


# -- small pieces -----------------------------------------------------------
def prose(text: str) -> str:
    """Escaped text; torch's `code spans` become <code>."""
    return _CODE_SPAN.sub(lambda m: f"<code>{m.group(1)}</code>", escape(text))


def where(loc: Optional[SourceLocation], root: Optional[str]) -> str:
    label = present.location_label(loc, root)
    return f'<span class="loc">{escape(label)}</span>' if label else '<span class="loc">unknown location</span>'


def source_line(loc: Optional[SourceLocation]) -> str:
    if loc is None or not loc.code:
        return ""
    return (f'<pre class="src"><span class="gutter">{loc.line}</span>'
            f"{escape(loc.code)}</pre>")


def notes(items: list[tuple[str, str]]) -> str:
    """A definition list of (label, already-escaped html) pairs."""
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in items if v)
    return f'<dl class="notes">{rows}</dl>' if rows else ""


def section(anchor: str, title: str, inner: str, detail: str = "") -> str:
    extra = f' <span class="muted">{escape(detail)}</span>' if detail else ""
    return f'<section id="{anchor}">\n<h2>{escape(title)}{extra}</h2>\n{inner}\n</section>'


def swatch(color: str) -> str:
    return f'<span class="swatch" style="background:{escape(color)}"></span>'


# -- sections -----------------------------------------------------------
def _header(report: Report, root: Optional[str]) -> str:
    run = report.run
    chips = "".join(f'<span class="chip">{escape(f)}</span>' for f in common.run_facts(report))
    target = " ".join([present.display_path(run.target, root), *run.args])
    return (f'<header><h1>fuselens report</h1><p class="target"><code>{escape(target)}</code></p>'
            f'<p class="chips">{chips}</p></header>')


def _summary(report: Report) -> str:
    c = common.counts(report)

    def card(label: str, value: str, anchor: str, bad: bool, sub: str = "") -> str:
        cls = "card bad" if bad else "card"
        sub_html = f'<div class="sub">{escape(sub)}</div>' if sub else ""
        return (f'<a class="{cls}" href="#{anchor}"><div class="num">{escape(value)}</div>'
                f'<div class="label">{escape(label)}</div>{sub_html}</a>')

    hits = f"{common.plural(c.graph_break_hits, 'hit')}" if c.graph_breaks else ""
    limit = f"{c.recompile_limits} hit the limit" if c.recompile_limits else ""
    cards = [
        card("errors", str(c.errors), "errors", c.errors > 0),
        *([card("fallbacks", str(c.notes), "fallbacks", False, "ran correctly")] if c.notes else []),
        card("graph breaks", str(c.graph_breaks), "graph-breaks", c.graph_breaks > 0, hits),
        card("recompiles", str(c.recompiles), "recompiles", c.recompiles > 0, limit),
        card("compiled graphs", str(c.graphs), "graphs", False),
        card("kernels", str(c.kernels), "kernels", False, present.duration_us(common.kernel_time_us(report))
             if common.kernel_time_us(report) else "not timed"),
        card("fusion", f"{c.fused} / {c.not_fused}", "fusion", False, "fused / not fused"),
        card("compile time", present.duration_s(common.compile_seconds(report)), "time", False,
             f"wall {present.duration_s(report.timings.wall_s)}" if report.timings.wall_s else ""),
    ]
    verdict = common.summary_line(report)
    ok = not (c.errors or c.graph_breaks or c.recompiles)
    return (f'<section id="summary"><p class="verdict {"ok" if ok else "bad"}">{escape(verdict)}</p>'
            f'<div class="cards">{"".join(cards)}</div></section>')


def _errors(report: Report, root: Optional[str]) -> str:
    """Only a failed program or diverged ranks; fallbacks are in _notes."""
    errors = common.failures(report)
    if not errors:
        return ""
    items = [_entry(err, "error", f"error: {err.kind}", root) for err in errors]
    return section("errors", f"Errors ({len(errors)})", "\n".join(items), common.errors_detail(errors))


def _notes(report: Report, root: Optional[str]) -> str:
    found = common.notes(report)
    if not found:
        return ""
    items = [_entry(err, "warn", f"warning: {common.note_category(err)}", root) for err in found]
    return section("fallbacks", f"Fallbacks ({len(found)})", "\n".join(items), common.NOTES_DETAIL)


def _entry(err: ErrorEntry, cls: str, tag: str, root: Optional[str]) -> str:
    first = err.message.splitlines()[0] if err.message else ""
    tb = (f"<details><summary>Traceback</summary><pre>{escape(err.traceback)}</pre></details>"
          if err.traceback else "")
    fn = err.location.function if err.location else ""
    return (
        f'<article class="finding {cls}"><h3>{where(err.location, root)} '
        f'<span class="tag {cls}">{escape(tag)}</span> {escape(first)}</h3>'
        f"{source_line(err.location)}"
        f"{notes([('in', f'<code>{escape(fn)}</code>' if fn else ''), ('compile', escape(err.compile_id)), ('why', prose(err.explained))])}"
        f"{tb}</article>"
    )


def fix_notes(fixes: list[FixAdvice]) -> list[tuple[str, str]]:
    """(label, html) rows for the catalogue's fixes; verified ones marked."""
    rows = []
    for f in fixes:
        label, text = common.fix_label(f)
        cls = "fix verified" if f.preferred else "fix"
        rows.append((label, f'<span class="{cls}">{prose(text)}</span>'))
        rows.append(("because", prose(f.detail)))
    return rows


def _graph_breaks(report: Report, root: Optional[str]) -> str:
    breaks = common.program_breaks(report)
    if not breaks:
        return ""
    items = []
    for gb in sorted(breaks, key=lambda g: -g.count):
        count = f'<span class="count">×{gb.count}</span>' if gb.count > 1 else ""
        rid = (f'<a class="tag" href="{escape(common.gb_doc_url(gb))}">{escape(gb.registry_id)}</a>'
               if gb.registry_id else "")
        fn = gb.location.function
        stack = " ← ".join(where(s, root) for s in reversed(gb.user_stack[:-1])) if len(gb.user_stack) > 1 else ""
        items.append(
            f'<article class="finding warn"><h3>{where(gb.location, root)} '
            f'<span class="tag warn">graph break</span> {prose(gb.explained or gb.reason)} {count} {rid}</h3>'
            f"{source_line(gb.location)}"
            + notes(
                [("in", (f"<code>{escape(fn)}</code>" if fn else "") + (f", compile {escape(gb.compile_id)}" if gb.compile_id else "")),
                 ("torch says", prose(gb.reason) if gb.explained else ""),
                 ("type", prose(gb.gb_type) if gb.gb_type and gb.gb_type != gb.reason else "")]
                + fix_notes(gb.fixes)
                + [("why", prose(gb.explanation))]
                + [("hint", prose(h)) for h in gb.hints]
                + [("called from", stack)]
            )
            + "</article>"
        )
    hits = common.break_hits(breaks)
    return section("graph-breaks", f"Graph breaks ({len(breaks)})", "\n".join(items),
                   common.plural(hits, "hit"))


def _recompiles(report: Report, root: Optional[str]) -> str:
    if not report.recompiles:
        return ""
    items = []
    for rc in report.recompiles:
        tag = '<span class="tag error">recompile limit</span>' if rc.hit_limit else '<span class="tag warn">recompile</span>'
        pairs = [("guard failed", prose(r)) for r in rc.reasons]
        if rc.call_site is not None:
            pairs.append(("called at", where(rc.call_site, root)))
        pairs += [("changed", escape(common.shape_change_text(sc))) for sc in rc.shape_changes]
        pairs += [("dtype", escape(d)) for d in rc.dtype_changes]
        if rc.hit_limit:
            pairs.append(("limit", present.RECOMPILE_LIMIT))
        pairs += fix_notes(rc.fixes)
        if not rc.fixes:
            pairs.append(("fix", f'<span class="fix">{prose(rc.fix)}</span>' if rc.fix else ""))
        pairs += [("torch says", f"<code>{escape(r)}</code>") for r in rc.raw_reasons]
        items.append(
            f'<article class="finding {"error" if rc.hit_limit else "warn"}"><h3>{where(rc.location, root)} {tag} '
            f"<code>{escape(rc.function)}</code> (compile {escape(rc.compile_id)})</h3>"
            f"{source_line(rc.location)}{notes(pairs)}</article>"
        )
    return section("recompiles", f"Recompiles ({len(report.recompiles)})", "\n".join(items))


def _time_charts(report: Report) -> str:
    phase_bars = charts.phase_bars(report)  # nested phases indented under their parent
    compile_html = (charts.bar_chart(phase_bars, title="Compile time per phase") if phase_bars
                    else '<p class="muted">No compile phases were recorded.</p>')
    timed = common.kernels_by_time(report)
    kernel_bars = [
        charts.Bar(k.name, k.total_time_us, present.duration_us(k.total_time_us),
                   f"{k.name} ({k.kind}, {k.device}): {present.duration_us(k.total_time_us)} over {k.calls} calls",
                   color=_kernel_color(report, k))
        for k in timed[:MAX_KERNEL_BARS]
    ]
    more = (f'<p class="muted">{len(timed) - MAX_KERNEL_BARS} faster kernels not shown.</p>'
            if len(timed) > MAX_KERNEL_BARS else "")
    kernel_html = (charts.bar_chart(kernel_bars, title="Kernel time per kernel") + more if kernel_bars
                   else '<p class="muted">Kernels were not timed in this run.</p>')
    total = common.compile_seconds(report)
    ktime = common.kernel_time_us(report)
    kernel_total = f" ({escape(present.duration_us(ktime))} in total)" if ktime else ""
    inner = (f'<div class="charts"><figure><figcaption>Compile time per phase '
             f'({escape(present.duration_s(total))} in total)</figcaption>{compile_html}</figure>'
             f'<figure><figcaption>Kernel time per kernel{kernel_total}</figcaption>{kernel_html}</figure></div>')
    return section("time", "Where the time went", inner)


def _kernel_color(report: Report, kernel: Kernel) -> str:
    return common.all_kernel_colors(report).get((kernel.graph_id, kernel.name), "#4e79a7")


def _graphs(report: Report, root: Optional[str], draw: Drawer) -> str:
    if not report.graphs:
        return ""
    parts = []
    for i, g in enumerate(report.graphs):
        colors = common.kernel_colors(report, g)
        legend = "".join(f'<li>{swatch(c)}<code>{escape(k)}</code></li>' for k, c in colors.items())
        legend += f'<li>{swatch(common.IO_FILL)}inputs and outputs</li>'
        legend += (f'<li>{swatch(common.UNFUSED_FILL)}not in a kernel (views, unfused)</li>' if colors else
                   f'<li class="muted">no kernels recorded for this graph (backend {escape(g.backend)})</li>')
        pic = draw(report, g, root, f"graph{i}")
        picture = (f'<div class="graph-svg">{pic.svg}</div>' if pic.svg
                   else f'<p class="notice">{escape(pic.message)}</p>')
        ops = ", ".join(f"<code>{escape(o)}</code>" for o in g.ops) or '<span class="muted">no ops</span>'
        parts.append(
            f'<article class="graph" id="graph-{i}"><h3>{escape(common.graph_title(g))}</h3>'
            f'<p>{where(g.location, root)} · backend {escape(g.backend)} · {common.plural(len(g.ops), "op")}</p>'
            f'<details><summary>ops in order</summary><p class="ops">{ops}</p></details>'
            f'<ul class="legend">{legend}</ul>{picture}</article>'
        )
    return section("graphs", f"Compiled graphs ({len(report.graphs)})", "\n".join(parts))


def _kernels(report: Report, root: Optional[str]) -> str:
    if not report.kernels:
        return ""
    timed = common.kernels_by_time(report)
    order = timed + [k for k in report.kernels if k not in timed]
    rows = []
    for k in order:
        lines = ", ".join(where(s, root) for s in k.source_lines)
        ops = ", ".join(f"<code>{escape(o)}</code>" for o in k.ops)
        time = escape(present.duration_us(k.total_time_us)) if k.total_time_us else "-"
        src = (f'<details><summary>source ({escape(k.language or "call")}, {len(k.source.splitlines())} lines)</summary>'
               f'<pre class="kernel-src">{escape(k.source)}</pre></details>' if k.source else "")
        rows.append(
            f'<tr><td><div class="kname">{swatch(_kernel_color(report, k))}<code>{escape(k.name)}</code></div>{src}</td>'
            f"<td>{escape(k.graph_id.split(':')[0])}</td>"
            f"<td>{escape(k.kind)}</td><td>{escape(k.device)}</td><td class='n'>{k.calls or '-'}</td>"
            f"<td class='n'>{time}</td><td>{ops}</td><td>{lines}</td></tr>"
        )
    table = ('<div class="table-wrap"><table class="kernels"><thead><tr><th>kernel</th><th>compile</th><th>kind</th><th>device</th><th>calls</th>'
             '<th>time</th><th>fused ops</th><th>user lines</th></tr></thead><tbody>'
             + "".join(rows) + "</tbody></table></div>")
    return section("kernels", f"Kernels ({len(report.kernels)})", table)


def _fusion(report: Report, root: Optional[str]) -> str:
    if not report.fusion:
        return ""
    order = [d for d in report.fusion if d.decision == "not_fused"] + [d for d in report.fusion if d.decision == "fused"]
    rows = []
    for d in order:
        ok = d.decision == "fused"
        verdict = '<span class="tag ok">fused</span>' if ok else '<span class="tag error">not fused</span>'
        nodes = " + ".join(f"<code>{escape(n)}</code>" for n in d.nodes)
        kernel = f"<code>{escape(d.kernel)}</code>" if d.kernel else ""
        option = f'<span class="fix"><code>{escape(d.option)}</code></span>' if d.option else ""
        lines = ", ".join(where(x, root) for x in d.locations)
        rows.append(f"<tr><td>{verdict}</td><td>{nodes}</td><td>{kernel}</td><td>{escape(d.rule)}</td>"
                    f"<td>{prose(d.reason)}</td><td>{option}</td><td>{lines}</td></tr>")
    c = common.counts(report)
    table = ('<div class="table-wrap"><table class="fusion"><thead><tr><th>decision</th><th>nodes</th><th>kernel</th><th>rule</th>'
             '<th>reason</th><th>to change it</th><th>user lines</th></tr></thead><tbody>'
             + "".join(rows) + "</tbody></table></div>")
    return section("fusion", "Fusion decisions", table, f"{c.fused} fused, {c.not_fused} not fused")


def _program_output(report: Report) -> str:
    parts = []
    for name, text in (("stdout", report.run.stdout_tail), ("stderr", report.run.stderr_tail)):
        if text.strip():
            parts.append(f"<details><summary>Program {name} (tail)</summary><pre>{escape(text)}</pre></details>")
    return section("output", "Program output", "".join(parts)) if parts else ""
