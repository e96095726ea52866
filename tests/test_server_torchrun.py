"""The language server's configured entry under torchrun:
`[tool.fuselens] nproc_per_node = N` runs every rank (real torchrun, gloo on
CPU) and maps the merged findings, with their ranks, to diagnostics. Trust
is unchanged: an entry outside the trusted folder still runs nothing."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from fuselens.events import ErrorEntry, GraphBreak, Report, RunInfo, SourceLocation
from fuselens.server.analysis import RunPlan
from fuselens.server.diagnostics import report_findings
from fuselens.server.program import ProgramText
from fuselens.server.project import load_config
from fuselens.server.resolve import Resolver
from lsp_workspaces.harness import command, diagnostics, open_file, save_file, session, uri, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
DDP_PROGRAM = os.path.join(HERE, "distributed", "train_ddp.py")


def test_nproc_per_node_is_read_from_tool_fuselens_and_a_bad_value_is_a_problem(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.fuselens]\nentry = "train.py"\nnproc_per_node = 2\n')
    assert load_config(str(tmp_path / "pyproject.toml")).nproc_per_node == 2
    (tmp_path / "pyproject.toml").write_text('[tool.fuselens]\nnproc_per_node = "two"\n')
    config = load_config(str(tmp_path / "pyproject.toml"))
    assert config.nproc_per_node is None and any("nproc_per_node" in p for p in config.problems)


def test_the_same_entry_with_and_without_torchrun_are_different_cache_entries():
    plan = RunPlan("u", "entry", "train.py", ["train.py"], "/p", {}, ProgramText("", ""), [], "", "train.py")
    ranked = RunPlan("u", "entry", "train.py", ["train.py"], "/p", {}, ProgramText("", ""), [], "", "train.py",
                     nproc_per_node=2)
    assert plan.key != ranked.key


def test_findings_of_a_torchrun_run_name_their_ranks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("a = 1\nb = 2\nc = 3\n")
    doc = uri(script)
    at = SourceLocation(str(script), 2, "f")
    report = Report(
        run=RunInfo(target="torchrun"),
        graph_breaks=[GraphBreak(at, "print", ranks=[1]), GraphBreak(at, "inside DDP", origin="ddp-wrapper", ranks=[0, 1])],
        errors=[ErrorEntry("exception", "boom", location=SourceLocation(str(script), 3, "f"), ranks=[1]),
                ErrorEntry("divergence", "graph break on rank 1 only, not on rank 0: print", location=at, ranks=[1])],
    )
    resolver = Resolver(ProgramText.for_script(str(script), doc, script.read_text()), [str(tmp_path)], default_uri=doc)
    by_code = {}
    for finding in report_findings(report, resolver)[doc]:
        by_code.setdefault(finding.code, []).append(finding.diagnostic.message)
    (gb,) = by_code["graph-break"]  # the DDP wrapper's break is by design: no diagnostic
    assert gb.endswith("On rank 1.")
    crash, divergence = sorted(by_code["error"], key=lambda m: "diverged" in m)
    assert crash.endswith("On rank 1.")
    assert divergence.startswith("The ranks diverged") and "On rank" not in divergence


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun with gloo on Linux")
async def test_torchrun_entry_runs_every_rank_and_puts_the_divergence_on_its_line(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy(DDP_PROGRAM, root / "train.py")
    (root / "pyproject.toml").write_text(
        '[tool.fuselens]\nentry = "train.py --break-on-rank 1 --steps 2"\nnproc_per_node = 2\n'
        'backend = "eager"\ntimeout = 150\n')
    async with session(root) as client:
        doc = open_file(client, root / "train.py")
        save_file(client, root / "train.py")
        errors = await wait_until(lambda: diagnostics(client, doc, "error"), 180)
        (divergence,) = [d for d in errors if "diverged" in d.message]
        assert divergence.range.start.line == 41  # the print in Net.forward (line 42)
        assert "graph break on rank 1 only, not on rank 0" in divergence.message
        (gb,) = diagnostics(client, doc, "graph-break")
        assert gb.range.start.line == 41 and gb.message.endswith("On rank 1.")
        summary = await command(client, "fuselens.analyze", doc)
        assert summary["cached"] is True and "divergence" in summary["errors"]


async def test_torchrun_entry_outside_the_trusted_folder_runs_nothing(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = tmp_path / "ran"
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (ws / "script.py").write_text("pass\n")
    (ws / "pyproject.toml").write_text('[tool.fuselens]\nentry = "../evil.py"\nnproc_per_node = 2\n')
    async with session(ws) as client:
        summary = await command(client, "fuselens.analyze", open_file(client, ws / "script.py"))
        assert summary == {"status": "outside-trusted-folders"}
    assert not marker.exists()
