"""The fuselens profiler app (Textual).

Data flow, one way: a profile run (the capture worker, kept alive between
runs by `WorkerSession`) returns a `Report`; py-spy samples the worker while
it runs; the app keeps every run's report and shows the latest against the
one before. The run happens in the worker's reader thread (`run_async` runs
it in an executor); the app's own coroutine only awaits it, so keys answer
while a program runs and cancelling kills the worker at once.

This module never imports torch, nor anything that does.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Optional, Protocol

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widgets import DataTable, Footer, ProgressBar, Static
from textual.worker import Worker

from fuselens import present
from fuselens.capture.target import RunOptions, Target
from fuselens.events import ErrorEntry, Report, RunInfo
from fuselens.tui.detail import KernelScreen
from fuselens.tui.export import export_report, relative
from fuselens.tui.model import FATAL_ERRORS, find_kernel, kernel_noise, kernel_rows, sort_rows
from fuselens.tui.sampling import HostProfile, Sampler
from fuselens.tui.toggles import TOGGLES_BY_KEY, ToggleState
from fuselens.tui.widgets import (
    KERNEL_COLUMNS,
    HostPanel,
    IssuesPanel,
    KernelChart,
    KernelTable,
    SummaryBar,
    TogglePanel,
)

# `s` walks through these; a header click picks one directly.
SORT_ORDER = ("total", "mean", "calls", "delta", "bandwidth", "name", "kind", "graph")


class ProfileSession(Protocol):
    """What the app needs from `fuselens.capture.WorkerSession`."""

    @property
    def pid(self) -> Optional[int]: ...

    async def run_async(self, options: Optional[RunOptions] = None, on_event: Any = None) -> Report: ...

    def close(self) -> None: ...


class FuselensApp(App):
    """Kernel table, chart, toggles, graph breaks and host samples of a run."""

    CSS_PATH = "app.tcss"
    TITLE = "fuselens"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    BINDINGS = [
        Binding("r", "rerun", "Re-run"),
        Binding("e", "export", "Export"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("t", "focus_panel('toggles')", "Toggles"),
        Binding("k", "focus_panel('kernels')", "Kernels"),
        Binding("p", "focus_panel('host')", "Python"),
        Binding("x", "cancel_run", "Cancel"),
        Binding("q", "quit", "Quit"),
    ]

    sort_column: reactive[str] = reactive("total", init=False)
    sort_reverse: reactive[bool] = reactive(True, init=False)
    running: reactive[bool] = reactive(False, init=False)

    def __init__(
        self,
        target: Optional[Target] = None,
        *,
        session: Optional[ProfileSession] = None,
        options: Optional[RunOptions] = None,
        toggles: Optional[ToggleState] = None,
        reports: Optional[list[Report]] = None,
        host_profiles: Optional[list[Optional[HostProfile]]] = None,
        labels: Optional[list[str]] = None,
        export_dir: str = ".",
        sample: bool = True,
        no_sample_reason: Optional[str] = None,
    ) -> None:
        """Live (`session` given: runs `target` on mount and on each toggle)
        or replay (`reports`: recorded runs, oldest first; no session)."""
        super().__init__()
        self.target = target
        self.session = session
        self.base_options = options or RunOptions()
        self.toggles = toggles or ToggleState()
        self.reports: list[Report] = list(reports or [])
        self.host_profiles: list[Optional[HostProfile]] = list(host_profiles or [None] * len(self.reports))
        self.labels: list[str] = list(labels or ["recorded"] * len(self.reports))
        self.export_dir = export_dir
        self.sample = sample
        self.no_sample_reason = no_sample_reason or "sampling is off (--no-sample)"
        self.exported: list[str] = []  # paths written by `e`, newest last
        self._pending = False  # a toggle changed while a run was going
        self._events = 0
        self._run_started = 0.0
        self._run_label = ""
        self._sampler: Optional[Sampler] = None
        self._last_pid: Optional[int] = None
        self._profile_worker: Optional[Worker] = None
        self._closed = False

    # ---- layout -------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield SummaryBar(id="summary")
        with Horizontal(id="status-row"):
            yield Static(id="status")
            yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="progress")
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield KernelTable(id="kernels")
                with Horizontal(id="lower"):
                    yield KernelChart(id="chart")
                    yield HostPanel(id="host")
            with Vertical(id="side"):
                yield TogglePanel(self.toggles, id="toggles")
                with VerticalScroll(id="issues-scroll"):
                    yield IssuesPanel(id="issues")
        yield Footer()

    def on_mount(self) -> None:
        self._main.query_one("#kernels").border_title = "kernels"
        self._main.query_one("#chart").border_title = "time per kernel"
        self._main.query_one("#host").border_title = "host Python (py-spy)"
        self._main.query_one("#toggles").border_title = "toggles (enter/←/→)"
        self._main.query_one("#issues-scroll").border_title = "breaks · recompiles · errors"
        self._main.query_one("#progress").display = False
        self._main.query_one(KernelTable).focus()
        self.set_interval(0.25, self._tick)
        if self.reports:
            self.refresh_views()
        if self.session is not None:
            self.start_profile()
        elif not self.reports:
            self._status("nothing to show: no target and no recorded report")
        else:
            self._status(f"replay of {len(self.reports)} recorded run(s); toggles and r need a live target")

    # ---- showing runs -------------------------------------------------

    @property
    def _main(self):
        """The main screen (panels live there even while the kernel screen is up)."""
        return self.screen_stack[0]

    @property
    def current(self) -> Optional[Report]:
        return self.reports[-1] if self.reports else None

    @property
    def previous(self) -> Optional[Report]:
        return self.reports[-2] if len(self.reports) > 1 else None

    def refresh_views(self) -> None:
        """Redraw every panel from the latest run and the one before."""
        report = self.current
        if report is None:
            return
        noise = kernel_noise(self.reports, self.labels)
        rows = kernel_rows(report, self.previous, noise)
        direction = "↓" if self.sort_reverse else "↑"
        label = f"{self.sort_column} {direction}"
        if self.previous is not None:
            label += (" · Δ beyond run-to-run noise, ~ within" if noise
                      else " · Δ ?: noise unmeasured, r repeats a run")
        self._main.query_one(KernelTable).show(sort_rows(rows, self.sort_column, self.sort_reverse), label)
        run_no = len(self.reports)
        self._main.query_one(KernelChart).show(rows)
        self._main.query_one(SummaryBar).show(report, self.previous, run_no, self.labels[-1])
        self._main.query_one(IssuesPanel).show(report)
        self._main.query_one(HostPanel).show(self.host_profiles[-1] if self.host_profiles else None)

    def add_run(self, report: Report, profile: Optional[HostProfile], label: str) -> None:
        """Append a finished run and show it against the previous one."""
        self.reports.append(report)
        self.host_profiles.append(profile)
        self.labels.append(label)
        try:
            self.refresh_views()
        except Exception as exc:  # a view bug must not take the session down
            self.notify(f"could not display run {len(self.reports)}: {type(exc).__name__}: {exc}",
                        severity="error", timeout=10)

    def watch_sort_column(self) -> None:
        self.refresh_views()

    def watch_sort_reverse(self) -> None:
        self.refresh_views()

    # The progress timer and a run's end can fire while the app shuts down, after its
    # widgets are gone: they update what is still there instead of raising.
    def watch_running(self, running: bool) -> None:
        for w in self._main.query("#progress"):
            w.display = running

    def _status(self, text: str) -> None:
        for w in self._main.query("#status").results(Static):
            w.update(text)

    def _tick(self) -> None:
        if self.running:
            elapsed = time.monotonic() - self._run_started
            queued = " · a re-run is queued" if self._pending else ""
            self._status(f"profiling run {len(self.reports) + 1} ({self._run_label}) "
                         f"{elapsed:.1f} s · {self._events} events{queued} · x cancels")

    # ---- running ------------------------------------------------------

    def start_profile(self) -> None:
        """Run the target with the current toggles in the background; if a
        run is going, queue one more run after it (with the latest toggles)."""
        if self.session is None:
            self.notify("replay mode: there is no live target to run", severity="warning")
            return
        if self.running:
            self._pending = True
            return
        self.running = True  # set now, so a second key press queues instead of starting twice
        self._pending = False
        options = self.toggles.options(self.base_options)
        self._run_label = self.toggles.describe()
        self._profile_worker = self._profile(options, self._run_label)

    @work(group="profile", exit_on_error=False)
    async def _profile(self, options: RunOptions, label: str) -> None:
        """One profile run: the worker runs the program, py-spy samples it."""
        assert self.session is not None
        self._events = 0
        self._run_started = time.monotonic()
        self._tick()
        sampler: Optional[Sampler] = None
        task = asyncio.ensure_future(self.session.run_async(options, on_event=self._count_event))
        try:
            if self.sample:
                sampler = await self._attach_sampler(task)
            report = await task
        except asyncio.CancelledError:
            task.cancel()
            if sampler is not None:
                sampler.kill()
            self._sampler = None
            self.running = False
            self._status("run cancelled; r runs again")
            raise
        except Exception as exc:  # the runner itself failed: show it, keep the app
            report = Report(RunInfo(target=self.target.label() if self.target else "", backend=options.backend or ""))
            report.errors.append(ErrorEntry("internal", f"the profile run failed: {type(exc).__name__}: {exc}"))
        profile = await asyncio.to_thread(sampler.stop) if sampler is not None else None
        self._sampler = None
        if profile is None and not self.sample:
            profile = HostProfile(error=self.no_sample_reason)
        self.running = False
        self.add_run(report, profile, label)
        self._finished_status(report)
        if self._pending:
            self.start_profile()

    async def _attach_sampler(self, task: asyncio.Future) -> Optional[Sampler]:
        """Start py-spy on the worker once its pid is known."""
        assert self.session is not None
        deadline = time.monotonic() + 10
        while self.session.pid is None and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        pid = self.session.pid
        if pid is None or task.done():
            return None
        if pid != self._last_pid:
            # A fresh interpreter: py-spy cannot attach before it is set up.
            await asyncio.sleep(0.3)
            self._last_pid = pid
        roots = tuple(self._user_roots())
        sampler = Sampler(user_roots=roots)
        self._sampler = sampler
        await asyncio.to_thread(sampler.start, pid)
        return sampler

    def _user_roots(self) -> list[str]:
        if self.target is None:
            return []
        if self.target.kind in ("script", "notebook"):
            return [os.path.dirname(self.target.value) + os.sep]
        return [os.path.abspath(self.target.cwd or os.getcwd()) + os.sep]

    def _count_event(self, event: Any) -> None:
        self._events += 1

    def _finished_status(self, report: Report) -> None:
        fatal = [e for e in report.errors if e.kind in FATAL_ERRORS]
        if fatal:
            first = fatal[0]
            self._status(f"run {len(self.reports)} failed: {first.kind}: {first.message.strip()[:120]}")
            self.notify(f"{first.kind}: {first.message.strip()[:200]}", title="the program failed",
                        severity="error", timeout=8)
        else:
            self._status(f"run {len(self.reports)} done in {present.duration_s(report.timings.wall_s)} · "
                         f"{len(report.kernels)} kernels · {self.toggles.describe()}")

    # ---- actions ------------------------------------------------------

    def action_rerun(self) -> None:
        self.start_profile()

    def action_cancel_run(self) -> None:
        if not self.running or self._profile_worker is None:
            self.notify("no run in progress")
            return
        self._pending = False
        self._profile_worker.cancel()

    def action_cycle_sort(self) -> None:
        index = SORT_ORDER.index(self.sort_column) if self.sort_column in SORT_ORDER else -1
        column = SORT_ORDER[(index + 1) % len(SORT_ORDER)]
        self.sort_reverse = column not in ("name", "kind", "graph")
        self.sort_column = column

    def action_focus_panel(self, panel_id: str) -> None:
        while len(self.screen_stack) > 1:  # from the kernel screen: back to the panels
            self.pop_screen()
        self._main.query_one(f"#{panel_id}").focus()

    def action_export(self) -> None:
        report = self.current
        if report is None:
            self.notify("nothing to export yet", severity="warning")
            return
        try:
            written, problems = export_report(report, self.export_dir, len(self.reports))
        except OSError as exc:
            self.notify(f"export failed: {exc}", severity="error")
            return
        self.exported.extend(written)
        message = "wrote " + ", ".join(relative(p) for p in written)
        if problems:
            message += "\nskipped " + "; ".join(problems)
        self.notify(message, title="export", severity="warning" if problems else "information", timeout=8)

    async def action_quit(self) -> None:
        await self.shutdown()
        self.exit()

    async def shutdown(self) -> None:
        """Cancel a running profile (kills the worker), stop py-spy, close
        the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        worker = self._profile_worker
        if worker is not None and worker.is_running:
            worker.cancel()
            try:
                await asyncio.wait_for(worker.wait(), timeout=10)
            except Exception:  # cancelled or timed out: we are leaving anyway
                pass
        if self._sampler is not None:
            self._sampler.kill()
        if self.session is not None:
            await asyncio.to_thread(self.session.close)

    async def on_unmount(self) -> None:
        await self.shutdown()

    # ---- events from panels ------------------------------------------

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        if event.data_table.id != "kernels":
            return
        sort_key = dict((k, s) for k, _, s in KERNEL_COLUMNS).get(str(event.column_key.value))
        if sort_key is None:
            return
        if sort_key == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_reverse = sort_key not in ("name", "kind", "graph")
            self.sort_column = sort_key

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "kernels":
            return
        key = str(event.row_key.value)
        kernel = find_kernel(self.current, key)
        report = self.current
        if kernel is None:  # a kernel of the previous run that is gone now
            kernel, report = find_kernel(self.previous, key), self.previous
        if kernel is None or report is None:
            return
        self.push_screen(KernelScreen(report, kernel, find_kernel(self.previous, key)))

    def on_toggle_panel_changed(self, event: TogglePanel.Changed) -> None:
        toggle = TOGGLES_BY_KEY[event.key]
        if self.session is None:
            self.notify("replay mode: toggles apply to a live target", severity="warning")
            return
        if not self.toggles.applies(toggle):
            self.notify(f"{toggle.label} applies to the {toggle.scope} backend; select it to use this",
                        severity="warning")
            return
        self.start_profile()
