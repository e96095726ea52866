"""The terminal view: findings a person can act on, in the manner of ruff
(`path:line: kind message`, the source line under a gutter, then `= why`,
`= hint`, `= fix` lines), followed by compiled graphs, kernels, fusion
decisions and compile time per phase.

`render_terminal(report)` returns the text; the Rich Console is created per
call (never at import time) so output can be captured and tested.
"""

from __future__ import annotations

import io
from typing import Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fuselens import present
from fuselens.events import (
    ORIGIN_OPTIMIZER_STEP, CompiledGraph, ErrorEntry, FixAdvice, FusionDecision, GraphBreak, Kernel, Recompile, Report,
    SourceLocation,
)
from fuselens.report import charts, common, ranks_view

# How many ops of a graph or kernel to list before "... and N more".
MAX_OPS_SHOWN = 40
MAX_KERNELS_SUMMARY = 8  # slowest first
MAX_FUSION_SUMMARY = 8
TRACEBACK_TAIL_LINES = 6


def _op_list(ops: list[str]) -> str:
    """`ops` joined, cut at MAX_OPS_SHOWN."""
    more = f", ... and {len(ops) - MAX_OPS_SHOWN} more" if len(ops) > MAX_OPS_SHOWN else ""
    return ", ".join(ops[:MAX_OPS_SHOWN]) + more


def render_terminal(
    report: Report,
    *,
    width: int = 100,
    color: bool = False,
    quiet: bool = False,
    root: Optional[str] = None,
    verbose: bool = False,
) -> str:
    """The report as terminal text. `color` adds ANSI styles; `quiet` keeps
    only findings (errors, graph breaks, recompiles) and the summary; paths
    inside `root` are shown relative to it. By default it is a summary that
    fits a screen (findings with their fixes, the top kernels and blocked
    fusions, merged across recompiles); `verbose` lists everything."""
    report = common.bounded(report)
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )
    v = _View(console, root, verbose)
    v.header(report)
    v.ranks(report)
    v.errors(common.failures(report))
    v.notes(common.notes(report))
    v.graph_breaks(common.program_breaks(report))
    v.recompiles(report.recompiles)
    v.optimizer_breaks(common.by_design_breaks(report, ORIGIN_OPTIMIZER_STEP))
    v.ddp(report)
    if not quiet:
        v.graphs(report)
        v.kernels(report)
        v.fusion(report.fusion)
        v.phases(report)
    v.summary(report)
    # Rich pads grid cells to the full width; trailing blanks help nobody.
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


class _View:
    """Writes sections to one console; small methods, one per section."""

    def __init__(self, console: Console, root: Optional[str], verbose: bool = False):
        self.c = console
        self.root = root
        self.verbose = verbose

    # -- pieces -----------------------------------------------------------
    def where(self, loc: Optional[SourceLocation]) -> str:
        return present.location_label(loc, self.root) or "<unknown location>"

    def section(self, title: str, detail: str = "") -> None:
        self.c.print()
        line = Text(title, style="bold underline")
        if detail:
            line.append(f"  {detail}", style="dim")
        self.c.print(line)

    def source(self, loc: Optional[SourceLocation]) -> None:
        """The user's line under a numbered gutter, as ruff shows it."""
        if loc is None or not loc.code:
            return
        num = str(loc.line)
        pad = " " * len(num)
        self.c.print(Text(f" {pad} |", style="blue"))
        gutter = Text(f" {num} | ", style="blue")
        gutter.append(loc.code)
        self.c.print(gutter)
        self.c.print(Text(f" {pad} |", style="blue"))

    def note(self, label: str, text: str, style: str = "") -> None:
        """`  = label: text`, wrapped lines aligned under `text`."""
        if not text:
            return
        head = Text("  = ", style="blue")
        head.append(f"{label}:", style="bold " + style if style else "bold")
        self.hanging(head, Text(text))

    def hanging(self, head: Text, body: Text, body_style: str = "") -> None:
        """`head body` where `body` wraps with a hanging indent."""
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold", style=body_style)
        grid.add_row(head, body)
        self.c.print(grid)

    def headline(self, loc_text: str, code: str, code_style: str, message: str, extra: str = "") -> None:
        line = Text(f"{loc_text}: ", style="bold")
        line.append(code, style=code_style)
        line.append(" ")
        line.append(message, style="bold")
        if extra:
            line.append(f" {extra}", style="dim")
        self.c.print(line)

    # -- sections ---------------------------------------------------------
    def header(self, report: Report) -> None:
        run = report.run
        title = Text("fuselens report ", style="bold")
        title.append(" ".join([present.display_path(run.target, self.root), *run.args]), style="bold cyan")
        self.c.print(title)
        self.c.print(Text(" · ".join(common.run_facts(report)), style="dim"))

    def errors(self, errors: list[ErrorEntry]) -> None:
        if not errors:
            return
        self.section(f"Errors ({len(errors)})", common.errors_detail(errors))
        for err in errors:
            self.error(err, "error", "bold red")

    def error(self, err: ErrorEntry, level: str, style: str) -> None:
        first, *_ = err.message.splitlines() or [""]
        self.headline(self.where(err.location), f"{level}[{err.kind}]", style, first,
                      f"(compile {err.compile_id})" if err.compile_id else "")
        self.source(err.location)
        self.note("on", ranks_view.ranks_label(err.ranks))
        if err.location and err.location.function:
            self.note("in", err.location.function)
        self.note("why", err.explained)
        if err.traceback:
            tail = [ln for ln in err.traceback.rstrip().splitlines() if ln.strip()][-TRACEBACK_TAIL_LINES:]
            for ln in tail:
                self.hanging(Text("   "), Text(ln), "dim")
        self.c.print()

    def notes(self, notes: list[ErrorEntry]) -> None:
        """Fallbacks: the program ran correctly; these cost speed only."""
        if not notes:
            return
        self.section(f"Fallbacks ({len(notes)})", common.NOTES_DETAIL)
        if self.verbose:
            for err in notes:
                self.error(err, "warning", "bold yellow")
            return
        by_kind: dict[str, list[ErrorEntry]] = {}
        for err in notes:
            by_kind.setdefault(err.kind, []).append(err)
        for kind, errs in by_kind.items():
            cat = common.note_category(errs[0])
            firsts = sorted({e.message.splitlines()[0].split(" in graph ")[0] for e in errs if e.message})
            shown = "; ".join(firsts[:3]) + (f"; ... and {len(firsts) - 3} more" if len(firsts) > 3 else "")
            ranks = ranks_view.ranks_label(sorted({r for e in errs for r in e.ranks}))
            shown += f" (on {ranks})" if ranks else ""
            self.hanging(Text(f"  warning[{cat}] ×{len(errs)}", style="bold yellow"), Text(shown))
        self.c.print(Text("  (--verbose lists each one)", style="dim"))

    def fixes(self, fixes: list[FixAdvice], fallback: str = "") -> None:
        """The catalogue's fixes: a verified one is marked preferred."""
        shown = fixes if self.verbose else fixes[:2]
        for f in shown:
            self.note(*common.fix_label(f), "green")
            if f.detail and (self.verbose or f is shown[0]):
                self.note("because", f.detail)
        if not fixes and fallback:
            self.note("fix", fallback, "green")

    def graph_breaks(self, breaks: list[GraphBreak]) -> None:
        if not breaks:
            return
        hits = common.break_hits(breaks)
        self.section(f"Graph breaks ({len(breaks)})", f"{common.plural(hits, 'hit')} in total")
        for gb in sorted(breaks, key=lambda g: -g.count):
            extra = f"[{gb.registry_id}]" if gb.registry_id else ""
            count = f" ×{gb.count}" if gb.count > 1 else ""
            self.headline(self.where(gb.location), f"graph-break{count}", "bold yellow", gb.explained or gb.reason, extra)
            self.source(gb.location)
            self.note("on", ranks_view.ranks_label(gb.ranks))
            where = gb.location.function
            self.note("in", f"{where}, compile {gb.compile_id}" if where and gb.compile_id else where or "")
            if gb.explained:
                self.note("torch says", gb.reason)
            elif gb.gb_type and gb.gb_type != gb.reason:
                self.note("type", gb.gb_type)
            if self.verbose or not gb.explained:
                self.note("why", gb.explanation)
            self.fixes(gb.fixes)
            if self.verbose or not gb.fixes:
                for hint in gb.hints:
                    self.note("hint", hint, "green")
            if len(gb.user_stack) > 1:
                self.note("called from", " <- ".join(self.where(s) for s in reversed(gb.user_stack[:-1])))
            self.note("docs", common.gb_doc_url(gb))
            self.c.print()

    def recompiles(self, recompiles: list[Recompile]) -> None:
        """Grouped per compiled function (file and def line): a timeline of
        causes, each recompile once, then the fixes for the group."""
        if not recompiles:
            return
        groups = common.recompiles_by_function(recompiles)
        self.section(f"Recompiles ({len(recompiles)})", f"in {common.plural(len(groups), 'function')}")
        for group in groups:
            first = group[0]
            limit = any(rc.hit_limit for rc in group)
            code = "recompile-limit" if limit else "recompile"
            count = f" ×{len(group)}" if len(group) > 1 else ""
            self.headline(self.where(first.location), f"{code}{count}", "bold magenta",
                          f"{first.function}: {common.recompile_headline(first)}")
            self.source(first.location)
            self.note("on", ranks_view.ranks_label(sorted({r for rc in group for r in rc.ranks})))
            if first.call_site is not None and first.call_site != first.location:
                self.note("called at", self.where(first.call_site))
            timeline = group if self.verbose or len(group) <= 6 else group[:3] + group[-2:]
            for i, rc in enumerate(timeline):
                if timeline is not group and i == 3:
                    self.c.print(Text(f"    ... {len(group) - 5} more like these", style="dim"))
                self.hanging(Text(f"    {rc.compile_id:>5}", style="magenta"), Text(common.recompile_headline(rc)))
            if limit:
                self.note("limit", present.RECOMPILE_LIMIT, "red")
            self.fixes(common.group_fixes(group), first.fix)
            if self.verbose:
                for rc in group:
                    for sc in rc.shape_changes:
                        self.note("changed", f"{rc.compile_id}: {common.shape_change_text(sc)}")
                    for dc in rc.dtype_changes:
                        self.note("dtype", f"{rc.compile_id}: {dc}")
                    for raw in rc.raw_reasons:
                        self.note("torch says", raw)
            self.c.print()

    def ranks(self, report: Report) -> None:
        """Distributed runs: one row per rank, the slowest named."""
        if not report.ranks:
            return
        self.section(f"Ranks ({len(report.ranks)})")
        table = Table(box=None, padding=(0, 2), show_edge=False)
        head, *rows = ranks_view.rank_rows(report)
        for name in head:
            table.add_column(name, justify="left" if name in ("host", "status") else "right")
        for row in rows:
            table.add_row(*row, style="red" if row[3] not in ("ok",) else "")
        self.c.print(table)
        slowest = ranks_view.slowest_line(report)
        if slowest:
            self.c.print(Text(f"  {slowest}", style="bold"))

    def optimizer_breaks(self, breaks: list[GraphBreak]) -> None:
        """torch.optim's graph breaks around a step: by design, listed so none looks missing."""
        if not breaks:
            return
        hits = common.break_hits(breaks)
        self.section("Optimizer step", f"{common.plural(hits, 'graph break')} by design, not findings")
        for gb in sorted(breaks, key=lambda g: (g.location.file, g.location.line)):
            count = f" ×{gb.count}" if gb.count > 1 else ""
            self.headline(self.where(gb.location), f"by-design{count}", "bold cyan", gb.explained or gb.reason)
        self.c.print()

    def ddp(self, report: Report) -> None:
        """Dynamo's DDP graph splits and DDP-wrapper breaks: not the program's graph breaks."""
        wrapper = ranks_view.ddp_wrapper_breaks(report)
        if not report.ddp_splits and not wrapper:
            return
        self.section("DistributedDataParallel", "bucket boundaries, not graph breaks")
        for split in report.ddp_splits:
            self.headline(self.where(split.location), "ddp-split", "bold cyan", ranks_view.split_headline(split))
            self.note("on", ranks_view.ranks_label(split.ranks))
            for i, line in enumerate(ranks_view.bucket_lines(split)):
                self.note(f"bucket {i}", line.split(": ", 1)[1])
            self.note("option", split.option, "green")
            self.c.print()
        if wrapper:
            self.headline(self.where(wrapper[0].location), "ddp-wrapper", "bold cyan", ranks_view.wrapper_line(wrapper))
            self.note("on", ranks_view.ranks_label(sorted({r for gb in wrapper for r in gb.ranks})))
            self.c.print()

    def graphs(self, report: Report) -> None:
        if not report.graphs:
            return
        if not self.verbose:
            self.section(f"Compiled graphs ({len(report.graphs)})", "--verbose lists their ops")
            return
        self.section(f"Compiled graphs ({len(report.graphs)})")
        for g in report.graphs:
            self.graph(report, g)

    def graph(self, report: Report, g: CompiledGraph) -> None:
        line = Text(common.graph_title(g), style="bold cyan")
        on = f" · {ranks_view.ranks_label(g.ranks)}" if g.ranks else ""
        line.append(f"  {self.where(g.location)} · {g.backend} · {common.plural(len(g.ops), 'op')}{on}", style="dim")
        self.c.print(line)
        if g.ops:
            self.hanging(Text("    ops:"), Text(_op_list(g.ops)))
        ks = common.kernels_of(report, g)
        if ks:
            self.hanging(Text("    kernels:"), Text(", ".join(k.name for k in ks)))
        self.c.print()

    def kernels(self, report: Report) -> None:
        if not report.kernels:
            return
        merged = common.merged_kernels(report.kernels)
        total = common.kernel_time_us(report)
        detail = f"{present.duration_us(total)} in total" if total else "not timed"
        if len(merged) != len(report.kernels):
            detail += f"; {len(report.kernels)} across recompiles, merged by name"
        self.section(f"Kernels ({len(merged)})", detail)
        shown = merged if self.verbose else merged[:MAX_KERNELS_SUMMARY]
        for k in shown:
            self.kernel(k)
        if len(shown) < len(merged):
            self.c.print(Text(f"  ... {len(merged) - len(shown)} more (--verbose)", style="dim"))

    def kernel(self, k: Kernel) -> None:
        """`name  kind device · calls · time`, then its fused ops and user
        lines, each wrapping under itself (names are long; tables crop)."""
        line = Text(k.name, style="bold cyan")
        facts = [f"{k.kind} {k.device}".strip()]
        if k.graph_id:  # merged kernels list every compile they came from
            facts.append(f"compile {k.graph_id}")
        if k.calls:
            facts.append(common.plural(k.calls, "call"))
        if k.total_time_us:
            facts.append(present.duration_us(k.total_time_us))
        if k.ranks:
            facts.append(f"summed over {ranks_view.ranks_label(k.ranks)}")
        line.append("  " + " · ".join(facts), style="dim")
        self.c.print(line)
        if k.ops:  # a combo kernel's parts list hundreds (an optimizer step's): cut as a graph's are
            self.hanging(Text("    ops:"), Text(_op_list([present.short_op(o) for o in k.ops])))
        if k.source_lines:
            self.hanging(Text("    from:"), Text(_lines_label(k.source_lines, self.root)))

    def fusion(self, decisions: list[FusionDecision]) -> None:
        if not decisions:
            return
        blocked = [d for d in decisions if d.decision == "not_fused"]
        fused = [d for d in decisions if d.decision == "fused"]
        self.section(f"Fusion decisions ({len(decisions)})", f"{len(fused)} fused, {len(blocked)} not fused")
        if not self.verbose:
            # Merged across recompiles and graphs: one line per reason.
            for (rule, reason), n in common.blocked_reasons(blocked)[:MAX_FUSION_SUMMARY]:
                line = Text(f"  not fused ×{n} " if n > 1 else "  not fused ", style="bold red")
                line.append(f"[{rule}] " if rule else "", style="dim")
                self.hanging(line, Text(reason))
            if blocked or fused:
                self.c.print(Text("  (--verbose lists each decision)", style="dim"))
            return
        for d in blocked + fused:  # the actionable ones first
            ok = d.decision == "fused"
            line = Text("  fused     " if ok else "  not fused ", style="green" if ok else "bold red")
            line.append(" + ".join(d.nodes), style="bold")
            if ok and d.kernel:
                line.append(f" -> {d.kernel}", style="cyan")
            if d.rule:
                line.append(f" [{d.rule}]", style="dim")
            self.c.print(line)
            self.hanging(Text("     "), Text(d.reason))
            if d.locations:
                self.hanging(Text("     "), Text("at " + _lines_label(d.locations, self.root)), "dim")
            if d.option:
                self.hanging(Text("     "), Text(f"to change it: {d.option}"), "green")

    def phases(self, report: Report) -> None:
        # Nested phases (PhaseTime.parent) are indented under their parent;
        # the total is the top-level phases', never the sum of the rows.
        rows = [("  " * depth + ("└ " if depth else "") + name, secs) for name, secs, depth in charts.phase_rows(report)]
        if not rows:
            return
        total = common.compile_seconds(report)
        self.section("Compile time per phase", f"{present.duration_s(total)} in total")
        biggest = max(s for _, s in rows) or 1.0
        name_w = max(len(n) for n, _ in rows)
        bar_w = 40
        for name, secs in rows:
            n = max(1, round(bar_w * secs / biggest)) if secs > 0 else 0
            line = Text(f"  {name.ljust(name_w)}  ")
            line.append("█" * n, style="cyan")
            line.append(" " * (bar_w - n) + f"  {present.duration_s(secs)}")
            self.c.print(line)

    def summary(self, report: Report) -> None:
        self.c.print()
        c = common.counts(report)
        style = "bold red" if (c.errors or c.graph_breaks or c.recompiles) else "bold green"
        line = Text("Summary: ", style="bold")
        line.append(common.summary_line(report), style=style)
        if not (c.errors or c.graph_breaks or c.recompiles):
            line.append(" ✓", style=style)
        rest = [common.plural(c.graphs, "graph"), common.plural(c.kernels, "kernel")]
        if c.fused or c.not_fused:
            rest.append(f"{c.fused} fused / {c.not_fused} not fused")
        line.append(f"  ({', '.join(rest)})", style="dim")
        self.c.print(line)


def _lines_label(locs: list[SourceLocation], root: Optional[str]) -> str:
    """Several user lines, grouped by file: 'demo.py:26,27 util.py:3'."""
    by_file: dict[str, list[str]] = {}
    for loc in locs:
        path = present.location_label(loc, root).rsplit(":", 1)[0]
        line = str(loc.line)
        if line not in by_file.setdefault(path, []):
            by_file[path].append(line)
    return " ".join(f"{path}:{','.join(lines)}" for path, lines in by_file.items())
