"""`fuselens tui` on a torchrun job: the same command lines as `fuselens
report` (read by capture/distributed.launch_for), every rank captured by real
torchrun with gloo on CPU, the merged run shown in the app (a ranks column in
the kernel table, the divergence error, the ranks and the slowest one)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from fuselens.capture import RunOptions
from fuselens.capture.distributed import DistributedSession
from fuselens.cli import parse
from fuselens.tui import cli
from fuselens.tui.app import FuselensApp
from fuselens.tui.widgets import HostPanel, IssuesPanel, KernelTable, SummaryBar

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "distributed", "train_ddp.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun with gloo on Linux")


def session_of(argv: list[str]):
    """What `fuselens tui ARGV` would run: (session, target), no app."""
    args, program_args = parse(["tui", *argv])
    return cli.session_for(args, program_args)


def processes_with(needle: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if needle in cmdline:
                found.append(cmdline)
    return found


def test_nproc_per_node_and_a_torchrun_command_make_the_same_launch_as_report(tmp_path):
    session, target = session_of(["--nproc-per-node", "2", "--run-dir", str(tmp_path), "train.py", "--", "--lr", "3"])
    assert target is None and isinstance(session, DistributedSession)
    assert session.launch.torchrun_args == ["--standalone", "--nnodes", "1", "--nproc-per-node", "2",
                                            "train.py", "--lr", "3"]
    assert session.run_dir_of(2) == os.path.join(str(tmp_path), "run-002")  # each run its own directory
    session, target = session_of(["--", "torchrun", "--nnodes", "1", "--nproc-per-node", "2", "train.py"])
    assert target is None and session.launch.torchrun_args == ["--nnodes", "1", "--nproc-per-node", "2", "train.py"]


def test_bad_torchrun_usage_exits_2_with_one_line(capsys):
    assert cli.main(["--nproc-per-node", "0", "train.py"]) == 2
    assert "--nproc-per-node must be at least 1" in capsys.readouterr().err
    assert cli.main(["--run-dir", "/tmp/x", "train.py"]) == 2
    assert "--run-dir is for torchrun runs" in capsys.readouterr().err


async def wait_until(pilot, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for the app")
        await pilot.pause(0.2)


async def test_tui_runs_every_rank_and_shows_ranks_column_divergence_and_slowest_rank(tmp_path):
    runs = tmp_path / "runs"
    session, _ = session_of(["--nproc-per-node", "2", "--run-dir", str(runs), PROGRAM, "--",
                             "--break-on-rank", "1", "--steps", "2"])
    app = FuselensApp(None, session=session, options=RunOptions(timeout_s=150, time_kernels=True),
                      sample=False, no_sample_reason=cli.NO_SAMPLE_TORCHRUN)
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_until(pilot, lambda: len(app.reports) == 1 and not app.running, 180)
        report = app.current
        assert [r.status for r in report.ranks] == ["ok", "ok"], report.errors

        table = app.query_one(KernelTable)
        ranks = {str(table.get_cell(key, "name")): str(table.get_cell(key, "ranks")) for key in table.rows}
        assert ranks.get("gloo:all_reduce") == "0-1"  # a collective, on both ranks, its time summed
        assert "summed over ranks" in str(table.border_subtitle)

        issues = str(app.query_one(IssuesPanel).render())
        assert "✗ divergence [rank 1]" in issues and "rank 1 only, not on rank 0" in issues
        assert "Ranks (2)" in issues and "rank 0 ok" in issues and "rank 1 ok" in issues
        assert "slowest rank:" in issues
        summary = str(app.query_one(SummaryBar).render())
        assert "2 ranks (torchrun)" in summary and "✗ divergence" in summary
        assert str(app.query_one(HostPanel).border_subtitle) == cli.NO_SAMPLE_TORCHRUN
        await pilot.press("q")
    session.close()
    assert {"rank-00000.jsonl", "rank-00001.jsonl"} <= set(os.listdir(runs / "run-001"))
    assert processes_with(str(runs)) == []
