"""The panels of the main screen. Each widget renders values computed in
`fuselens.tui.model` (or `sampling`); none of them runs anything."""

from __future__ import annotations

from typing import Optional

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option
from textual_plotext import PlotextPlot

from fuselens import present
from fuselens.events import Report
from fuselens.report.ranks_view import rank_rows, ranks_label, slowest_line, split_headline
from fuselens.tui.model import (
    KernelRow,
    delta_text,
    format_delta_us,
    graph_label,
    summarize,
)
from fuselens.tui.sampling import HostProfile
from fuselens.tui.toggles import TOGGLES, ToggleState, format_value

# Kernel table columns: (key, label, sort key in model.SORT_KEYS or None).
KERNEL_COLUMNS: tuple[tuple[str, str, Optional[str]], ...] = (
    ("name", "kernel", "name"),
    ("graph", "graph", "graph"),
    ("calls", "calls", "calls"),
    ("total", "total", "total"),
    ("delta", "Δ prev", "delta"),
    ("mean", "mean", "mean"),
    ("share", "share", "total"),
    ("kind", "kind", "kind"),
    ("bandwidth", "GB/s", "bandwidth"),
    ("ops", "fused ops", None),
    ("lines", "user lines", None),
)
RANKS_COLUMN = "ranks"  # only for torchrun runs (KernelTable._rank_column)


def _right(text: str, style: str = "") -> Text:
    return Text(text, style=style, justify="right")


def _delta_cell(row: KernelRow) -> Text:
    if row.status == "first":
        return Text("")
    if row.status == "new":
        return _right("new", "bold yellow")
    if row.status == "gone":
        return _right(f"gone {format_delta_us(row.delta_us)}", "green")
    text, tone = delta_text(row)
    style = {"worse": "red", "better": "green", "noise": "dim", "unmeasured": "dim italic"}[tone]
    return _right(text, style)


class KernelTable(DataTable):
    """Kernels of the current run with the difference to the previous one."""

    _gone: dict = {}  # row key -> whether that row is a kernel gone since the previous run

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label, _ in KERNEL_COLUMNS:
            self.add_column(label, key=key)

    def show(self, rows: list[KernelRow], sort_label: str) -> None:
        """Replace the rows, keeping the cursor on the same kernel while it
        still runs; when it is gone (a toggle renamed or fused it) the cursor
        keeps its line instead of following the kernel to the "gone" rows at
        the bottom."""
        keep, keep_index = None, 0
        if self.row_count and 0 <= self.cursor_row < self.row_count:
            keep = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
            keep_index = self.cursor_row
        was_gone = self._gone.get(keep, False) if keep is not None else False
        self._gone = {row.key: row.status == "gone" for row in rows}
        scroll_y = self.scroll_y
        self.clear()
        ranked = self._rank_column(any(row.ranks for row in rows))
        for row in rows:
            dim = "dim" if row.status == "gone" else ""
            name = Text(row.name, style="dim strike" if row.status == "gone" else "bold")
            per_rank = [Text(row.ranks, style=dim or "magenta")] if ranked else []
            self.add_row(
                name,
                *per_rank,
                Text(graph_label(row.graph_id), style="dim"),
                _right(str(row.calls), dim),
                _right(present.duration_us(row.total_us), dim),
                _delta_cell(row),
                _right(present.duration_us(row.mean_us), dim),
                _right(f"{row.share * 100:.1f}%" if row.share is not None else "", dim),
                Text(row.kind if row.device == "cpu" else f"{row.kind}·{row.device}", style=dim),
                _right(f"{row.bandwidth_gbs:.1f}" if row.bandwidth_gbs is not None else "—", dim),
                Text(", ".join(present.short_op(o) for o in row.ops.split(", ") if o), style=dim),
                Text(row.user_lines, style=dim or "cyan"),
                key=row.key,
            )
        self.border_subtitle = f"sorted by {sort_label}" + (" · calls and times summed over ranks" if ranked else "")
        if keep is None or not rows:
            return
        if keep in self._gone and (was_gone or not self._gone[keep]):
            target = self.get_row_index(keep)
        else:
            target = min(keep_index, len(rows) - 1)
        self.scroll_y = scroll_y  # the same view, unless the cursor must move out of it
        self.move_cursor(row=target, animate=False)


    def _rank_column(self, wanted: bool) -> bool:
        """A torchrun run's table has a `ranks` column after the kernel name
        (a single process's has none); columns are rebuilt when that changes."""
        present = RANKS_COLUMN in self.columns
        if wanted != present:
            self.clear(columns=True)
            for key, label, _ in KERNEL_COLUMNS[:1] + ((RANKS_COLUMN, "ranks", None),) * wanted + KERNEL_COLUMNS[1:]:
                self.add_column(label, key=key)
        return wanted


def _short_name(name: str, width: int = 22) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


class KernelChart(PlotextPlot):
    """Horizontal bars: time per kernel (ms) of the current run, largest on
    top (the table has the per-kernel differences)."""

    TOP = 10  # bars at most; fewer when the plot has fewer rows

    _rows: Optional[list[KernelRow]] = None

    def on_resize(self) -> None:
        if self._rows is not None:
            self.show(self._rows)

    def show(self, rows: list[KernelRow]) -> None:
        self._rows = rows
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        live = [r for r in rows if r.status != "gone" and r.total_us > 0]
        live.sort(key=lambda r: (-r.total_us, r.name))
        # plotext aligns labels only when each bar gets exactly one row: show
        # as many bars as the plot has rows and pad the rest with empty bars
        # (at the bottom, so the largest kernel sits under the title).
        # (render() sizes the plot by self.size: title, frame and ticks take 4 rows.)
        height = self.size.height
        plot_rows = height - 4 if height > 4 else self.TOP
        live = live[: min(self.TOP, plot_rows)]
        if not live:
            # Kernels exist but were not timed (or there are none): no empty axes.
            plt.title("no kernel timings in this run" if rows else "no kernels in this run")
            self.refresh()
            return
        pad = max(0, plot_rows - len(live)) if height > 4 else 0
        names = [" " * (i + 1) for i in range(pad)] + [_short_name(r.name) for r in reversed(live)]
        values = [0.0] * pad + [r.total_us / 1e3 for r in reversed(live)]
        plt.bar(names, values, orientation="horizontal", color="cyan", width=0.3)  # thin: one row each
        plt.title("time per kernel (ms)")
        self.refresh()


class SummaryBar(Static):
    """Two lines: what ran, then the run's totals with deltas."""

    def show(self, report: Report, previous: Optional[Report], run_no: int, label: str) -> None:
        now = summarize(report)
        old = summarize(previous) if previous is not None else None
        head = Text.assemble(("run ", "dim"), (str(run_no), "bold"), ("  ", ""), (label, "italic"))
        if report.run.torch_version:
            head.append(f"  torch {report.run.torch_version} · {report.run.device}", "dim")
        if report.ranks:
            head.append(f"  {len(report.ranks)} ranks (torchrun)", "magenta")
        line = Text()
        self._item(line, "graphs", str(now.graphs), old and now.graphs - old.graphs)
        self._item(line, "breaks", str(now.breaks), old and now.breaks - old.breaks, bad_up=True)
        self._item(line, "recompiles", str(now.recompiles), old and now.recompiles - old.recompiles, bad_up=True)
        self._item(line, "compile", present.duration_s(now.compile_s),
                   old and (now.compile_s - old.compile_s) * 1e6, unit_us=True)
        self._item(line, "kernels", str(now.kernels), old and now.kernels - old.kernels)
        self._item(line, "kernel time", present.duration_us(now.kernel_us), old and now.kernel_us - old.kernel_us,
                   unit_us=True, base=old.kernel_us if old else None)
        per_step = now.wall_per_step_s
        old_step = old.wall_per_step_s if old else None
        self._item(line, "wall/step" if per_step is not None else "wall",
                   present.duration_s(per_step if per_step is not None else now.wall_s),
                   (per_step - old_step) * 1e6 if per_step is not None and old_step is not None else None,
                   unit_us=True, base=old_step * 1e6 if old_step else None)
        text = Text("\n").join([head, line])
        for error in now.errors[:1]:
            where = f" at {error.location.label()}" if error.location else ""
            first = error.message.strip().splitlines()[0] if error.message.strip() else error.kind
            text.append(f"\n✗ {error.kind}: {first}{where}", "bold red")
        self.update(text)

    @staticmethod
    def _item(line: Text, name: str, value: str, delta, bad_up: bool = True, unit_us: bool = False,
              base: Optional[float] = None) -> None:
        if line:
            line.append(" · ", "dim")
        line.append(f"{name} ", "dim")
        line.append(value, "bold")
        if delta:  # None, 0 and "no previous run" print nothing
            text = format_delta_us(delta, base) if unit_us else f"{delta:+d}"
            line.append(f" ({text})", "red" if (delta > 0) == bad_up else "green")


class TogglePanel(OptionList):
    """Compiler and backend switches. Enter/space/→ next value, ← previous."""

    BINDINGS = [
        Binding("space,right,l", "cycle(1)", "Next value", show=False),
        Binding("left,h", "cycle(-1)", "Previous value", show=False),
    ]

    class Changed(Message):
        """A toggle got a new value (already stored in the state)."""

        def __init__(self, key: str, value: object) -> None:
            super().__init__()
            self.key = key
            self.value = value

    def __init__(self, state: ToggleState, **kwargs) -> None:
        super().__init__(**kwargs)
        self.state = state

    def on_mount(self) -> None:
        self.rebuild()

    def _prompt(self, key: str) -> Text:
        toggle = next(t for t in TOGGLES if t.key == key)
        value = self.state.get(key)
        applies = self.state.applies(toggle)
        text = Text(f"{toggle.label:<18}", style="" if applies else "dim")
        changed = value != toggle.default
        text.append(format_value(value, toggle), style=("bold yellow" if changed else "bold") if applies else "dim")
        return text

    def rebuild(self) -> None:
        highlighted = self.highlighted
        options: list[Option | None] = []
        scope = None
        for toggle in TOGGLES:
            if toggle.scope != scope and toggle.scope != "run":
                options.append(Option(Text(f"── {toggle.scope} ──", style="dim italic"), disabled=True))
            scope = toggle.scope
            options.append(Option(self._prompt(toggle.key), id=toggle.key))
        self.set_options(options)
        self.highlighted = highlighted if highlighted is not None else 0

    def action_cycle(self, step: int) -> None:
        option = self.highlighted_option
        if option is None or option.id is None:
            return
        value = self.state.cycle(option.id, step)
        self.rebuild()
        self.post_message(self.Changed(option.id, value))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_cycle(1)


class IssuesPanel(Static):
    """Errors, graph breaks and recompiles of the current run, file:line first."""

    def show(self, report: Report) -> None:
        text = Text()
        for error in report.errors:
            where = f"{error.location.label()}  " if error.location else ""
            text.append(f"✗ {error.kind} ", "bold red")
            if error.ranks and report.ranks:
                text.append(f"[{ranks_label(error.ranks)}] ", "magenta")
            text.append(where, "cyan")
            text.append(error.message.strip() + "\n")
            if error.traceback and error.kind in ("exception", "internal", "syntax"):
                text.append("\n".join(error.traceback.strip().splitlines()[-4:]) + "\n", "dim")
        if report.errors and report.run.stderr_tail.strip() and not any(e.traceback for e in report.errors):
            text.append("\n".join(report.run.stderr_tail.strip().splitlines()[-4:]) + "\n", "dim")
        text.append(f"Graph breaks ({sum(b.count for b in report.graph_breaks)})\n", "bold")
        for gb in report.graph_breaks:
            text.append(present.short_location(gb.location.file, gb.location.line), "cyan")
            text.append(f" ×{gb.count} " if gb.count > 1 else " ", "dim")
            if gb.ranks and report.ranks:
                text.append(f"[{ranks_label(gb.ranks)}] ", "magenta")
            if gb.origin:  # inside DDP's own wrapper: by design, nothing to fix
                text.append(f"({gb.origin}, by design) ", "dim")
            text.append((gb.explained or gb.reason) + "\n")
            if gb.location.code:
                text.append(f"  {gb.location.code}\n", "dim")
            for hint in gb.hints[:1]:
                text.append(f"  → {hint}\n", "green")
        text.append(f"Recompiles ({len(report.recompiles)})\n", "bold")
        for rc in report.recompiles:
            text.append(present.short_location(rc.location.file, rc.location.line), "cyan")
            text.append(f" {rc.function} [{rc.compile_id}]", "dim")
            if rc.ranks and report.ranks:
                text.append(f" [{ranks_label(rc.ranks)}]", "magenta")
            text.append(" " + "; ".join(rc.reasons or rc.raw_reasons[:1]) + "\n")
            if rc.fix:
                text.append(f"  → {rc.fix}\n", "green")
            if rc.hit_limit:
                text.append("  recompile limit hit: running eager\n", "bold red")
        self._ranks(text, report)
        self.update(text)

    @staticmethod
    def _ranks(text: Text, report: Report) -> None:
        """A torchrun run: Dynamo's DDP splits, then each rank and the slowest."""
        for split in report.ddp_splits:
            text.append("DDP split ", "bold cyan")
            text.append(split_headline(split) + "\n")
            text.append(f"  → {split.option}\n", "green")
        if not report.ranks:
            return
        header, *rows = rank_rows(report)
        text.append(f"Ranks ({len(rows)})\n", "bold")
        for row in rows:
            cells = dict(zip(header, row))
            style = "" if cells["status"] == "ok" else "bold red"
            text.append(f"rank {cells['rank']} {cells['status']}", style or "magenta")
            text.append(f"  wall {cells['wall']} · compile {cells['compile']} · kernels {cells['kernels']}"
                        f" · collectives {cells['collectives']}\n", "dim")
        slowest = slowest_line(report)
        if slowest:
            text.append(slowest + "\n", "dim")


class HostPanel(DataTable):
    """Top Python functions in the worker by py-spy self time. The numbers
    come first and names are cut to the panel's width, so a long function
    name never pushes self/total out of sight (the panel is ~60 columns wide
    in a 160-column terminal)."""

    NUMBERS_WIDTH = 9 + 9 + 10  # self, total, category, with their cell padding

    CATEGORY_STYLE = {"user": "cyan", "compile": "magenta", "wrapper": "yellow", "torch": "blue",
                      "import": "dim", "fuselens": "dim", "other": ""}

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self._add_columns()

    def _add_columns(self) -> None:
        for key, label in (("self", "self"), ("total", "total"), ("category", "category"),
                           ("function", "function"), ("where", "where")):
            self.add_column(label, key=key)

    _profile: Optional[HostProfile] = None

    def on_resize(self) -> None:
        if self._profile is not None:
            self.show(self._profile)

    def _name_width(self) -> int:
        """Room for the function name: what the numbers leave, with ~14 columns for
        `where`; at least 12."""
        inner = self.size.width - 2 if self.size.width else 58
        return max(12, min(40, inner - self.NUMBERS_WIDTH - 14))

    def show(self, profile: Optional[HostProfile]) -> None:
        self._profile = profile
        self.clear(columns=True)  # columns never shrink otherwise: names are cut to the new width
        self._add_columns()
        if profile is None:
            self.border_subtitle = "waiting for a run"
            return
        if profile.error:
            self.border_subtitle = profile.error
            return
        total = profile.seconds or 1.0
        shares = sorted(profile.categories.items(), key=lambda kv: -kv[1])
        self.border_subtitle = f"{profile.samples} samples · " + " ".join(
            f"{cat} {sec / total * 100:.0f}%" for cat, sec in shares if sec / total >= 0.01
        )
        for stat in profile.functions:
            style = self.CATEGORY_STYLE.get(stat.category, "")
            self.add_row(
                _right(present.duration_s(stat.self_s)),
                _right(present.duration_s(stat.total_s), "dim"),
                Text(stat.category, style=style),
                Text(_short_name(stat.function, self._name_width()), style="bold"),
                Text(_short_name(present.short_location(stat.file, stat.line), 26), style="dim"),
            )
