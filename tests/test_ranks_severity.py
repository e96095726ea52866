"""Distributed findings under issue 18's severity model, without torchrun:
merged reports built from hand-written rank files (rankmerge is pure).

- a rank `divergence` is an error (the job can deadlock): counted as an
  error, listed under Errors, matched by `--fail-on error`;
- fallbacks stay notes, with the ranks they were on;
- kernels merged across recompiles keep the ranks of every entry;
- a rank that crashed in native code names the user's line from its
  faulthandler dump.
"""

from __future__ import annotations

import os

from fuselens.capture.rankmerge import fault_file, merge, merge_run_dir, rank_report, read_stream
from fuselens.events import (
    ErrorEntry,
    GraphBreak,
    Kernel,
    RankInfo,
    Report,
    RunInfo,
    SourceLocation,
    encode_event,
)
from fuselens.report import common
from fuselens.report.terminal import render_terminal

DONE_LINE = '{"type": "__done__", "data": {"wall_s": 1.0}}'


def _rank_lines(rank: int, events: list, done: bool = True) -> list[str]:
    info = RankInfo(rank=rank, local_rank=rank, world_size=2, host="h", pid=0)
    lines = [encode_event(info), encode_event(RunInfo(target="train.py", exit_code=0))]
    lines += [encode_event(e) for e in events]
    if done:
        lines.append(DONE_LINE)
    return lines


def _merged(events_by_rank: dict[int, list]) -> Report:
    reports = []
    for rank, events in events_by_rank.items():
        stream = read_stream(_rank_lines(rank, events))
        assert stream is not None
        reports.append(rank_report(stream))
    return merge(reports)


def _break(line: int) -> GraphBreak:
    return GraphBreak(location=SourceLocation("/work/p/train.py", line, "forward"), reason="print()",
                      compile_id="0/0")


def test_divergence_is_an_error_and_fails_on_error():
    report = _merged({0: [], 1: [_break(42)]})
    div = [e for e in report.errors if e.kind == "divergence"]
    assert div and div[0].ranks == [1]
    assert common.is_failure(div[0])
    assert div[0] in common.failures(report) and div[0] not in common.notes(report)
    assert common.counts(report).errors == 1
    assert "1 error" in common.summary_line(report)
    assert common.failing_findings(report, ["error"]) == ["error"]
    # not a fallback, an eager fallback or a fuselens bug
    assert common.failing_findings(report, ["fallback", "eager-fallback", "internal"]) == []
    text = render_terminal(report, root="/work/p")
    assert "Errors (1)" in text and "ranks diverged" in text
    assert "error[divergence]" in text and "warning[divergence]" not in text
    assert "on: rank 1" in text or "on rank 1" in text


def test_fallback_on_some_ranks_is_a_note_with_its_ranks():
    fb = ErrorEntry("fallback", "aten.nonzero fell back to ATen in graph 0/0")
    report = _merged({0: [fb], 1: [fb]})
    assert common.counts(report).errors == 0 and common.counts(report).notes == 1
    assert common.failing_findings(report, ["error"]) == []
    assert common.failing_findings(report, ["fallback"]) == ["fallback"]
    text = render_terminal(report)
    assert "Errors" not in text
    assert "warning[fallback]" in text and "ranks 0-1" in text


def test_merged_kernels_keep_every_rank():
    k0 = Kernel(name="triton_poi_0", kind="triton", graph_id="0/0:aot_forward", device="cpu", calls=1, ranks=[0])
    k1 = Kernel(name="triton_poi_0", kind="triton", graph_id="0/1:aot_forward", device="cpu", calls=1, ranks=[1])
    (m,) = common.merged_kernels([k0, k1])
    assert m.ranks == [0, 1] and m.calls == 2
    assert k0.ranks == [0]  # the inputs are not changed


def test_crashed_rank_names_the_line_of_its_faulthandler_dump(tmp_path):
    user = tmp_path / "train.py"
    user.write_text("x = 1\n")
    run = tmp_path / "run"
    run.mkdir()
    for rank, done in ((0, True), (1, False)):
        path = run / f"rank-{rank:05d}.jsonl"
        path.write_text("\n".join(_rank_lines(rank, [], done=done)) + "\n")
    (run / "fault-00001.txt").write_text(
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
        f'  File "{user}", line 7 in step\n  File "{user}", line 12 in <module>\n')
    assert fault_file(str(run / "rank-00001.jsonl")) == str(run / "fault-00001.txt")
    report = merge_run_dir(str(run))
    killed = [e for e in report.errors if e.kind == "killed"]
    assert killed and killed[0].ranks == [1]
    assert killed[0].location is not None and killed[0].location.line == 7
    assert os.path.basename(killed[0].location.file) == "train.py"
    assert common.is_failure(killed[0])
