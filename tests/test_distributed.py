"""Distributed runs: real torchrun, real gloo, two CPU ranks, each under
capture (`fuselens report --nproc-per-node 2 ...` / `-- torchrun ...`), and
the merge of the directory they write (`fuselens report --merge DIR`).

Each 2-rank run costs ~10-15 s on a 2-core machine; the module runs each
scenario once (module fixtures) and checks several facts of its report.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from fuselens.capture.rankmerge import merge_run_dir, ranks_label
from fuselens.events import Report

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "distributed", "train_ddp.py")
FSDP_PROGRAM = os.path.join(HERE, "distributed", "train_fsdp2.py")
ROOT = os.path.dirname(HERE)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun with gloo on Linux")


def _report(tmp_path, *args: str, timeout: float = 180) -> tuple[Report, str, subprocess.CompletedProcess]:
    """Run `fuselens report ... -f json` in a subprocess; the parsed report, its run dir."""
    os.makedirs(tmp_path, exist_ok=True)
    run_dir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "fuselens", "report", "-f", "json", "--run-dir", run_dir, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Report.from_json(proc.stdout), run_dir, proc


def _run_processes(run_dir: str) -> list[str]:
    """Command lines of live processes that belong to this run."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if run_dir in cmdline:
            found.append(cmdline)
    return found


@pytest.fixture(scope="module")
def ddp_split(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_split")
    return _report(tmp, "--nproc-per-node", "2", PROGRAM, "--", "--bucket-cap-mb", "1", "--width", "512",
                   "--backend", "eager")


@pytest.fixture(scope="module")
def divergent(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("divergent")
    return _report(tmp, "--", "torchrun", "--nnodes", "1", "--nproc-per-node", "2", PROGRAM, "--break-on-rank", "1")


@pytest.fixture(scope="module")
def crashing(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("crashing")
    return _report(tmp, "--nproc-per-node", "2", PROGRAM, "--", "--crash-on-rank", "1")


def test_every_rank_writes_its_own_stream_tagged_with_rank_local_rank_and_host(ddp_split):
    _, run_dir, _ = ddp_split
    files = sorted(f for f in os.listdir(run_dir) if f.startswith("rank-"))
    assert files == ["rank-00000.jsonl", "rank-00001.jsonl"]
    for rank, name in enumerate(files):
        with open(os.path.join(run_dir, name)) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        assert lines[0]["type"] == "RankInfo" and lines[0]["data"]["world_size"] == 2
        assert all(m["rank"] == rank and m["local_rank"] == rank and m["host"] for m in lines)


def test_ddp_bucket_split_is_reported_as_buckets_not_graph_breaks(ddp_split):
    report, _, _ = ddp_split
    (split,) = report.ddp_splits
    assert split.ranks == [0, 1]
    assert split.bucket_cap_mb == 1.0 and len(split.buckets) >= 2
    assert all(b.size_bytes > 0 and b.params for b in split.buckets)
    assert "bucket_cap_mb" in split.option and "optimize_ddp" in split.option
    # One graph per bucket, each its own graph id; no user graph break for them.
    pieces = [g for g in report.graphs if ":bucket" in g.graph_id]
    assert len(pieces) == len(split.buckets)
    assert [gb for gb in report.graph_breaks if not gb.origin] == []
    # DDP's own wrapper is not traced by Dynamo: set apart, not a finding.
    assert report.graph_breaks and all(gb.origin == "ddp-wrapper" for gb in report.graph_breaks)


def test_identical_findings_are_one_entry_with_all_ranks_and_no_divergence(ddp_split):
    report, _, _ = ddp_split
    assert all(gb.ranks == [0, 1] for gb in report.graph_breaks)
    assert not [e for e in report.errors if e.kind == "divergence"]
    assert [r.status for r in report.ranks] == ["ok", "ok"]


def test_collectives_are_in_the_kernel_table_with_their_time(ddp_split):
    report, _, _ = ddp_split
    collectives = {k.name: k for k in report.kernels if k.kind == "collective"}
    assert "gloo:all_reduce" in collectives
    assert collectives["gloo:all_reduce"].calls > 0 and collectives["gloo:all_reduce"].total_time_us > 0
    assert all(r.collective_time_us > 0 and r.compile_s > 0 and r.wall_s > 0 for r in report.ranks)


def test_terminal_report_names_ranks_slowest_rank_and_ddp_buckets(ddp_split, tmp_path):
    _, run_dir, _ = ddp_split
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-m", "fuselens", "report", "--merge", run_dir],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Ranks (2)" in out.stdout and "slowest rank:" in out.stdout
    assert "ddp-split" in out.stdout and "bucket_cap_mb=1" in out.stdout
    assert "on: ranks 0-1" in out.stdout


def test_merge_of_a_directory_written_by_two_ranks_gives_the_same_report(ddp_split):
    report, run_dir, _ = ddp_split
    merged = merge_run_dir(run_dir)
    # the live report is the JSON format's, which (as every format) bounds each value
    from fuselens.report.common import bounded

    assert bounded(merged).to_dict() == report.to_dict()


def test_graph_break_on_one_rank_only_is_flagged_as_rank_divergence(divergent):
    report, _, _ = divergent
    user = [gb for gb in report.graph_breaks if not gb.origin]
    assert user and all(gb.ranks == [1] for gb in user)
    divergence = [e for e in report.errors if e.kind == "divergence"]
    assert divergence and divergence[0].ranks == [1]
    assert "rank 1 only, not on rank 0" in divergence[0].message
    assert divergence[0].location.line == 42  # the print in Net.forward
    assert report.run.target.startswith("torchrun --nnodes 1 --nproc-per-node 2")


def test_crashing_rank_gives_its_finding_other_rank_is_stopped_and_nothing_is_left(crashing):
    report, run_dir, _ = crashing
    by_rank = {r.rank: r for r in report.ranks}
    assert by_rank[1].status == "failed" and by_rank[1].exit_code == 1
    crash = [e for e in report.errors if e.kind == "exception" and e.ranks == [1]]
    assert crash and "failed on purpose" in crash[0].message
    assert by_rank[0].status in ("failed", "killed")  # its collective lost the peer, or torchrun stopped it
    assert [e for e in report.errors if 0 in e.ranks]
    assert report.run.exit_code == 1
    assert _run_processes(run_dir) == []


def test_killed_rank_without_an_end_record_is_a_finding(tmp_path):
    report, run_dir, _ = _report(tmp_path, "--nproc-per-node", "2", PROGRAM, "--", "--kill-on-rank", "0")
    by_rank = {r.rank: r for r in report.ranks}
    assert by_rank[0].status == "killed"
    assert [e for e in report.errors if e.kind == "killed" and e.ranks == [0] and "end record" in e.message]
    assert _run_processes(run_dir) == []


@pytest.mark.slow
def test_hanging_rank_is_stopped_at_the_timeout_with_where_each_rank_was(tmp_path):
    report, run_dir, _ = _report(tmp_path, "--timeout", "25", "--nproc-per-node", "2", PROGRAM, "--",
                                 "--hang-on-rank", "1")
    assert [e for e in report.errors if e.kind == "timeout"]
    stopped = {e.ranks[0]: e for e in report.errors if e.kind == "killed" and e.ranks}
    assert stopped[1].location is not None and stopped[1].location.file == PROGRAM
    assert all(r.status == "killed" for r in report.ranks)
    assert _run_processes(run_dir) == []


def _losses(text: str) -> dict[tuple[int, int], float]:
    return {(int(r), int(s)): float(v) for r, s, v in re.findall(r"rank (\d+) step (\d+) loss ([-\d.]+)", text)}


@pytest.mark.slow
def test_fuselens_backend_inside_ddp_split_matches_eager_losses(tmp_path):
    args = ["--nproc-per-node", "2", PROGRAM, "--", "--bucket-cap-mb", "1", "--width", "512"]
    fl, _, _ = _report(tmp_path / "fl", *args, "--backend", "fuselens")
    eager, _, _ = _report(tmp_path / "eager", *args, "--no-compile")
    assert not [e for e in fl.errors], fl.errors
    assert fl.ddp_splits and len(fl.ddp_splits[0].buckets) >= 2
    got, want = _losses(fl.run.stdout_tail), _losses(eager.run.stdout_tail)
    assert len(want) == 6 and set(got) == set(want)
    assert all(abs(got[k] - want[k]) < 1e-4 for k in want)


@pytest.mark.slow
def test_inductor_inside_ddp_reports_the_bucket_split_and_its_kernels(tmp_path):
    report, _, _ = _report(tmp_path, "--nproc-per-node", "2", PROGRAM, "--", "--bucket-cap-mb", "1", "--width", "512",
                           "--steps", "2", "--backend", "inductor")
    assert [r.status for r in report.ranks] == ["ok", "ok"], report.errors
    (split,) = report.ddp_splits
    assert split.ranks == [0, 1] and len(split.buckets) >= 2
    assert [gb for gb in report.graph_breaks if not gb.origin] == []
    assert not [e for e in report.errors if e.kind == "divergence"]
    # Inductor compiled each bucket's piece: its kernels, from both ranks
    pieces = [g for g in report.graphs if ":bucket" in g.graph_id]
    assert len(pieces) == len(split.buckets) and all(g.ranks == [0, 1] for g in pieces)
    compiled = [k for k in report.kernels if k.kind != "collective" and k.backend == "inductor"]
    assert compiled and all(k.ranks == [0, 1] for k in compiled)
    assert "gloo:all_reduce" in {k.name for k in report.kernels if k.kind == "collective"}


def test_fsdp2_root_compile_breaks_at_fully_shard_hooks_and_the_report_says_so(tmp_path):
    report, _, _ = _report(tmp_path, "--nproc-per-node", "2", FSDP_PROGRAM, "--", "--compile", "root")
    assert [r.status for r in report.ranks] == ["ok", "ok"], report.errors
    # torch 2.13: FSDP2 runs its hooks under torch._dynamo.disable, so compiling the
    # fully_shard root stops at its call; torch's text names only `disable`.
    (gb,) = report.graph_breaks
    assert gb.ranks == [0, 1] and gb.location.file == FSDP_PROGRAM and "disable" in gb.explanation
    assert gb.explained.startswith("FSDP2 hooks: fully_shard runs its pre/post-forward hooks")
    assert [f.cause for f in gb.fixes] == ["fsdp-hooks"] and "torch.compile(block.forward)" in gb.fixes[0].detail
    assert not [e for e in report.errors if e.kind == "divergence"]
    assert {k.name for k in report.kernels if k.kind == "collective"} >= {"gloo:all_gather", "gloo:all_reduce"}


def test_fsdp2_program_compiling_inside_sharded_layers_compiles_graphs_on_every_rank(tmp_path):
    report, _, _ = _report(tmp_path, "--nproc-per-node", "2", FSDP_PROGRAM, "--", "--compile", "layers")
    assert [r.status for r in report.ranks] == ["ok", "ok"], report.errors
    assert report.graphs and all(g.ranks == [0, 1] for g in report.graphs)
    assert report.graph_breaks == [] and not report.errors
    assert all(r.compile_s > 0 and r.collective_time_us > 0 for r in report.ranks)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_writing_one_shared_run_dir_merge_into_one_report(tmp_path):
    """The README's multi-host recipe, with two torchrun agents (nodes) on
    this machine: each runs `fuselens report --run-dir SHARED -- torchrun
    --nnodes 2 --node-rank N ...`, then `--merge SHARED` renders both."""
    shared = str(tmp_path / "shared")
    port = str(_free_port())
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "fuselens", "report", "-q", "-f", "json", "--run-dir", shared, "--",
         "torchrun", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port,
         "--nproc-per-node", "1", PROGRAM, "--steps", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path)) for node in (0, 1)]
    for node in nodes:
        out, err = node.communicate(timeout=240)
        assert node.returncode == 0, err[-3000:]
    merged = subprocess.run([sys.executable, "-m", "fuselens", "report", "-f", "json", "--merge", shared],
                            capture_output=True, text=True, env=env, timeout=60)
    assert merged.returncode == 0, merged.stderr
    report = Report.from_json(merged.stdout)
    assert [(r.rank, r.node_rank, r.status) for r in report.ranks] == [(0, 0, "ok"), (1, 1, "ok")], report.errors
    assert len([f for f in os.listdir(shared) if f.startswith("launch-")]) == 2  # one per node's launcher
    assert "gloo:all_reduce" in {k.name for k in report.kernels if k.kind == "collective"}
    assert not [e for e in report.errors if e.kind in ("divergence", "killed")]
    assert _run_processes(shared) == []


def test_ranks_label_names_ranges():
    assert ranks_label([0, 1, 2, 3, 5]) == "ranks 0-3, 5"
    assert ranks_label([1]) == "rank 1"
