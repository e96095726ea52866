"""Pilot tests of every TUI interaction.

Replay tests drive the app on recorded runs (fast). Live tests drive it on
the real capture worker running a small program from tmp_path, mostly with
`backend="eager"` so a run costs the worker's start (importing torch) and not
a compile; the Inductor test is marked slow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fuselens.capture import RunOptions, Target, WorkerSession
from fuselens.events import Report
from fuselens.tui.app import FuselensApp
from fuselens.tui.detail import KernelScreen
from fuselens.tui.sampling import py_spy_path
from fuselens.tui.toggles import ToggleState
from fuselens.tui.widgets import HostPanel, IssuesPanel, KernelTable, SummaryBar

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def recorded() -> list[Report]:
    return [Report.from_json((FIXTURES / f"tui_report_{n}.json").read_text()) for n in "ab"]


def text_of(widget) -> str:
    """The plain text a Static-based widget shows."""
    return str(widget.render())


def table_column(table, column: str) -> list[str]:
    return [str(table.get_cell(row_key, column)) for row_key in table.rows]


async def wait_until(pilot, predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for the app")
        await pilot.pause(0.1)


# ---- replay: recorded runs -------------------------------------------


async def test_s_cycles_the_sort_column_and_a_header_click_reverses_it():
    app = FuselensApp(reports=recorded())
    async with app.run_test(size=(160, 45)) as pilot:
        table = app.query_one(KernelTable)
        totals = table_column(table, "name")
        assert totals[0] == "cpp_layer_norm_0"  # largest total first
        await pilot.press("s")  # -> mean
        assert app.sort_column == "mean"
        await pilot.press("s", "s", "s", "s")  # calls, delta, bandwidth, name
        assert app.sort_column == "name" and app.sort_reverse is False
        names = [n for n in table_column(table, "name")][:7]
        assert names == sorted(names)
        await pilot.click("#kernels", offset=(3, 1))  # the "kernel" header: same column, reversed
        assert app.sort_column == "name" and app.sort_reverse is True
        assert table_column(table, "name")[0] == "extern_mm_0"
        assert "sorted by name ↓" in str(table.border_subtitle)


async def test_enter_opens_the_kernel_source_and_its_not_fused_pairs_and_escape_returns():
    app = FuselensApp(reports=recorded())
    async with app.run_test(size=(140, 40)) as pilot:
        table = app.query_one(KernelTable)
        table.move_cursor(row=table.get_row_index("0/0:dynamo/extern_mm_0"))
        await pilot.press("enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, KernelScreen) and screen.kernel.name == "extern_mm_0"
        decisions = text_of(screen.query_one("#kernel-decisions"))
        assert "✗ not fused gelu + mm" in decisions
        assert "extern library call" in decisions
        await pilot.press("escape")
        assert not isinstance(app.screen, KernelScreen)
        # A kernel gone since the previous run opens with the previous run's data.
        table.move_cursor(row=table.get_row_index("0/0:dynamo/cpp_fused_layer_norm_gelu_0"))
        await pilot.press("enter")
        await pilot.pause()
        decisions = text_of(app.screen.query_one("#kernel-decisions"))
        assert "✓ fused layer_norm + gelu" in decisions
        syntax = app.screen.query_one("#kernel-code").content  # a rich Syntax: highlighted
        assert "#pragma omp parallel for" in syntax.code
        assert syntax.lexer.name == "C++"


async def test_e_exports_the_current_run_as_report_files(tmp_path):
    app = FuselensApp(reports=recorded(), export_dir=str(tmp_path))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("e")
        await pilot.pause()
    exported = {Path(p).suffix for p in app.exported}
    assert ".json" in exported
    json_path = next(Path(p) for p in app.exported if p.endswith(".json"))
    assert json_path.name == "fuselens-train_step-run2.json"
    assert Report.from_json(json_path.read_text()) == recorded()[1]
    if ".md" in exported:  # the report package's Markdown renderer is present
        md = (tmp_path / "fuselens-train_step-run2.md").read_text()
        assert "cpp_layer_norm_0" in md


async def test_q_quits_and_panel_keys_move_focus_even_from_the_kernel_screen():
    app = FuselensApp(reports=recorded())
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("t")
        assert app.focused.id == "toggles"
        await pilot.press("p")
        assert app.focused.id == "host"
        await pilot.press("k", "enter")
        await pilot.pause()
        assert isinstance(app.screen, KernelScreen)
        await pilot.press("t")
        assert not isinstance(app.screen, KernelScreen) and app.focused.id == "toggles"
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_a_toggle_in_replay_mode_changes_nothing_and_says_why():
    app = FuselensApp(reports=recorded())
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("t", "down", "down", "enter")  # fusion: on -> off
        await pilot.pause()
        assert len(app.reports) == 2 and not app.running
        assert any("replay mode" in n.message for n in app._notifications)


class RecordedSession:
    """A live session that answers each run with the next recorded report."""

    pid = None

    def __init__(self, reports: list[Report]) -> None:
        self.reports = list(reports)

    async def run_async(self, options=None, on_event=None) -> Report:
        return self.reports.pop(0) if len(self.reports) > 1 else self.reports[0]

    def close(self) -> None:
        pass


def cursor_key(table) -> str:
    return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)


async def test_the_kernel_cursor_stays_put_across_the_refresh_after_a_toggle():
    # issue 19.11: the table jumped to the bottom after a toggle
    a, b = recorded()
    app = FuselensApp(Target.from_cli([__file__]), session=RecordedSession([a, b, b]), sample=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running, 10)
        table = app.query_one(KernelTable)
        table.move_cursor(row=table.get_row_index("0/0:dynamo/cpp_fused_sum_2"))
        await pilot.press("t", "down", "down", "enter")  # fusion: on -> off, a new run
        await wait_until(pilot, lambda: len(app.reports) == 2 and not app.running, 10)
        await pilot.pause()
        # a kernel that still runs keeps the cursor, wherever the sort put it now
        assert cursor_key(table) == "0/0:dynamo/cpp_fused_sum_2" and table.cursor_row == 5
        # a kernel that the toggle fused away: the cursor keeps its line, it does not
        # follow the kernel to the "gone" rows at the bottom
        table.move_cursor(row=table.get_row_index("0/0:dynamo/cpp_layer_norm_0"))
        assert table.cursor_row == 0
        await pilot.press("r")
        await wait_until(pilot, lambda: len(app.reports) == 3 and not app.running, 10)
        await pilot.pause()
        assert cursor_key(table) == "0/0:dynamo/cpp_layer_norm_0" and table.cursor_row == 0
        # run 3 repeats run 2's toggles: the same times are within the (zero) noise
        assert str(table.get_cell("0/0:dynamo/extern_mm_0", "delta")) == "~"


async def test_a_gone_kernel_under_the_cursor_leaves_the_cursor_on_its_line():
    a, b = recorded()
    app = FuselensApp(Target.from_cli([__file__]), session=RecordedSession([a, b]), sample=False)
    async with app.run_test(size=(160, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running, 10)
        table = app.query_one(KernelTable)
        assert cursor_key(table) == "0/0:dynamo/cpp_fused_layer_norm_gelu_0"  # top row
        await pilot.press("r")
        await wait_until(pilot, lambda: len(app.reports) == 2 and not app.running, 10)
        await pilot.pause()
        assert table.cursor_row == 0 and cursor_key(table) == "0/0:dynamo/cpp_layer_norm_0"
        assert table.get_row_index("0/0:dynamo/cpp_fused_layer_norm_gelu_0") == table.row_count - 2


# ---- live: the real worker -------------------------------------------


def program(tmp_path: Path, body: str, name: str = "prog.py") -> Target:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return Target.from_cli([str(path)])


GRAPH_BREAK_PROGRAM = """\
import torch

def step(x):
    y = torch.sin(x) + 1
    print("between")  # graph break
    return (y * 2).sum()

f = torch.compile(step, backend="eager")
for _ in range(3):
    f(torch.randn(8, 8))
"""


def live_app(target: Target, tmp_path: Path, backend: str = "eager", timeout_s: float = 120.0,
             sample: bool = False) -> FuselensApp:
    return FuselensApp(
        target,
        session=WorkerSession(target),
        options=RunOptions(timeout_s=timeout_s, time_kernels=True),
        toggles=ToggleState(backend=backend),
        export_dir=str(tmp_path),
        sample=sample,
    )


async def test_live_run_shows_graph_breaks_with_file_line_and_r_reruns_in_the_same_worker(tmp_path):
    target = program(tmp_path, GRAPH_BREAK_PROGRAM)
    app = live_app(target, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1)
        issues = text_of(app.query_one(IssuesPanel))
        assert "prog.py:5" in issues and "Graph breaks (" in issues
        pid = app.session.pid
        await pilot.press("r")
        await wait_until(pilot, lambda: len(app.reports) == 2 and not app.running)
        assert app.session.pid == pid  # the worker was kept: no Python restart
        assert not app.query_one("#progress").display
        summary = text_of(app.query_one(SummaryBar))
        assert summary.startswith("run 2")
        assert "breaks" in summary
        await pilot.press("q")
    assert app.session.pid is None


async def test_changing_a_toggle_reruns_with_the_new_backend_and_queues_while_running(tmp_path):
    # The sleep keeps run 2 going while the second toggle is pressed.
    target = program(tmp_path, GRAPH_BREAK_PROGRAM + "import time\ntime.sleep(2)\n")
    app = live_app(target, tmp_path, backend="eager")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running)
        assert app.reports[0].run.backend == "eager"
        await pilot.press("t")
        app.query_one("#toggles").highlighted = 0  # the backend row
        await pilot.press("right")  # eager -> program (the program's own: inductor)
        assert app.toggles.backend == "program" and app.running
        await pilot.press("left")  # back to eager while the run goes: queued
        assert app._pending
        await wait_until(pilot, lambda: len(app.reports) == 3 and not app.running, timeout=180)
        assert app.labels[1] == "backend=program" and app.reports[1].run.backend == ""
        assert app.labels[2] == "backend=eager" and app.reports[2].run.backend == "eager"


SLOW_PROGRAM = """\
import time
import torch

f = torch.compile(lambda x: x + 1)
f(torch.ones(2))
time.sleep(6)
"""


async def test_keys_answer_while_a_profile_runs(tmp_path):
    # The proof is the order, not a latency: the keys take effect while the run
    # is still going. A wall-clock bound flaked on CI, where the other test
    # worker compiles on the same two cores; a UI that waited for the run would
    # answer only after the program's 30 s sleep, with `running` already False.
    target = program(tmp_path, SLOW_PROGRAM.replace("time.sleep(6)", "time.sleep(30)"))
    app = FuselensApp(target, session=WorkerSession(target), reports=recorded(),
                      options=RunOptions(timeout_s=60), toggles=ToggleState(backend="eager"), sample=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: app._events > 0)  # the program is running
        await pilot.press("s")
        await pilot.press("t")
        assert app.sort_column == "mean" and app.focused.id == "toggles"
        assert app.running and app.query_one("#progress").display  # the progress indicator
        assert "profiling run 3" in text_of(app.query_one("#status"))


async def test_the_progress_timer_firing_after_the_widgets_are_gone_does_not_raise(tmp_path):
    # at shutdown the 0.25 s progress timer can fire after the status line is unmounted
    target = program(tmp_path, SLOW_PROGRAM)
    app = FuselensApp(target, session=WorkerSession(target), reports=recorded(),
                      options=RunOptions(timeout_s=60), toggles=ToggleState(backend="eager"), sample=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: app._events > 0)
        await app._main.query_one("#status").remove()
        await app._main.query_one("#progress").remove()
        app._tick()  # what the timer does then
        app.running = False  # and what a run's end does
        await pilot.pause()


CRASH_PROGRAM = """\
import torch

f = torch.compile(lambda x: x * 2)
f(torch.ones(2))
raise ZeroDivisionError("boom in the user program")
"""


async def test_a_crashing_program_shows_its_error_and_the_app_keeps_going(tmp_path):
    target = program(tmp_path, CRASH_PROGRAM, name="crash.py")
    app = live_app(target, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running)
        summary = text_of(app.query_one(SummaryBar))
        assert "✗ exception" in summary and "boom in the user program" in summary
        issues = text_of(app.query_one(IssuesPanel))
        assert "crash.py:5" in issues
        assert "failed" in text_of(app.query_one("#status"))
        await pilot.press("r")  # the app still answers and can run again
        await wait_until(pilot, lambda: len(app.reports) == 2 and not app.running)


async def test_a_hanging_program_is_killed_at_the_timeout_and_shown_as_an_error(tmp_path):
    target = program(tmp_path, "import time\nimport torch\ntime.sleep(600)\n", name="hang.py")
    app = live_app(target, tmp_path, timeout_s=6)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running, timeout=60)
        assert app.reports[0].errors[0].kind == "timeout"
        assert "✗ timeout" in text_of(app.query_one(SummaryBar))


async def test_x_cancels_a_run_and_q_during_a_run_quits_at_once(tmp_path):
    target = program(tmp_path, "import time\nimport torch\ntime.sleep(600)\n", name="hang.py")
    app = live_app(target, tmp_path)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_until(pilot, lambda: app.session.pid is not None)
        first_pid = app.session.pid
        await pilot.press("x")
        await wait_until(pilot, lambda: not app.running, timeout=10)
        assert "cancelled" in text_of(app.query_one("#status"))
        assert len(app.reports) == 0
        await pilot.press("r")
        await wait_until(pilot, lambda: app.session.pid not in (None, first_pid), timeout=10)
        second_pid = app.session.pid
        started = time.monotonic()
        await pilot.press("q")
    assert time.monotonic() - started < 8
    for pid in (first_pid, second_pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


HOT_PROGRAM = """\
import time
import torch

def hot_user_loop():
    s = 0
    for i in range(100000):
        s += i * i
    return s

f = torch.compile(lambda x: x + 1)
f(torch.ones(2))
end = time.time() + 1.5
while time.time() < end:
    hot_user_loop()
"""


@pytest.mark.skipif(py_spy_path() is None, reason="py-spy not installed")
async def test_host_panel_shows_the_programs_hot_python_function_from_py_spy(tmp_path):
    target = program(tmp_path, HOT_PROGRAM, name="hot.py")
    app = live_app(target, tmp_path, sample=True)
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running)
        profile = app.host_profiles[-1]
        assert profile is not None and profile.error == "", profile and profile.error
        names = {f.function: f.category for f in profile.functions}
        assert names.get("hot_user_loop") == "user"
        host = app.query_one(HostPanel)
        assert "hot_user_loop" in table_column(host, "function")
        assert "user" in str(host.border_subtitle)


def test_the_running_app_process_never_imports_torch(tmp_path):
    """The worker imports torch; the TUI process must not (it stays light)."""
    target = tmp_path / "prog.py"
    target.write_text(GRAPH_BREAK_PROGRAM)
    script = textwrap.dedent(f"""
        import asyncio, sys, time
        from fuselens.capture import RunOptions, Target, WorkerSession
        from fuselens.tui.app import FuselensApp
        from fuselens.tui.toggles import ToggleState

        async def main():
            target = Target.from_cli([{str(target)!r}])
            app = FuselensApp(target, session=WorkerSession(target), options=RunOptions(timeout_s=120),
                              toggles=ToggleState(backend="eager"), sample=False)
            async with app.run_test(size=(120, 36)) as pilot:
                deadline = time.monotonic() + 90
                while not app.reports and time.monotonic() < deadline:
                    await pilot.pause(0.1)
                await pilot.press("enter", "escape", "s", "t", "q")
            print("runs", len(app.reports), "torch", "torch" in sys.modules)

        asyncio.run(main())
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=150)
    assert "runs 1 torch False" in result.stdout, result.stdout + result.stderr


INDUCTOR_PROGRAM = """\
import torch

def f(x):
    y = torch.sin(x) * 2 + torch.cos(x)
    return y.sum()

cf = torch.compile(f)
x = torch.randn(256, 256)
for _ in range(5):
    cf(x)
"""


@pytest.mark.slow
async def test_inductor_kernels_appear_and_a_fusion_toggle_shows_the_difference(tmp_path):
    target = program(tmp_path, INDUCTOR_PROGRAM, name="ind.py")
    app = live_app(target, tmp_path, backend="inductor", timeout_s=300)
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running, timeout=300)
        table = app.query_one(KernelTable)
        names = table_column(table, "name")
        assert any(n.startswith("cpp_fused") for n in names), names
        await pilot.press("t")
        toggles = app.query_one("#toggles")
        toggles.highlighted = next(i for i, o in enumerate(toggles.options) if o.id == "inductor:max_fusion_size")
        await pilot.press("left")  # 64 -> 2
        await wait_until(pilot, lambda: len(app.reports) == 2 and not app.running, timeout=300)
        assert app.reports[1].run.backend == "inductor"
        assert "max_fusion_size=2" in app.labels[1]
        deltas = table_column(table, "delta")
        assert any(d for d in deltas)  # every row is compared with run 1
