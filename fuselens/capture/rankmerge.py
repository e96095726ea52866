"""One Report from the per-rank event files of a distributed run. Pure: no
torch, only reading files.

A run directory holds `rank-NNNNN.jsonl` (one per rank, written by
capture/rank.py, on any host) and `launch-*.jsonl` (what each `fuselens
report` launcher saw: the command, torchrun's exit code, a timeout). Each
rank's stream is folded alone (capture/assemble.py), then the ranks are
merged:

- a finding (graph break, recompile, error, graph, DDP split) that is the
  same on several ranks is one entry listing its `ranks`;
- a graph break or recompile on some ranks only is also a `divergence`
  error: ranks that compile different graphs can issue different
  collectives, and a compiled job hangs. A rank that failed before it could
  reach a finding is not counted against it;
- kernels of the same graph and name add their calls and time over ranks;
- `Report.ranks` has one RankInfo per rank: how it ended, its wall, compile,
  kernel and collective time;
- a rank whose stream has no end record, or that wrote nothing, gets a
  finding of its own.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, Optional

from fuselens.capture import faultstack
from fuselens.capture.assemble import ReportBuilder
from fuselens.capture.protocol import DONE
from fuselens.events import (
    DDPSplit,
    ErrorEntry,
    GraphBreak,
    Kernel,
    RankInfo,
    Recompile,
    Report,
    RunInfo,
    Timings,
    decode_event,
)

RANK_GLOB = "rank-*.jsonl"


def fault_file(events_path: str) -> str:
    """The faulthandler dump beside a rank's event file (capture/rank.py):
    DIR/rank-00001.jsonl -> DIR/fault-00001.txt (not matched by RANK_GLOB)."""
    folder, name = os.path.split(events_path)
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    return os.path.join(folder, "fault-" + stem.removeprefix("rank-") + ".txt")
LAUNCH_GLOB = "launch-*.jsonl"


@dataclass
class RankStream:
    """What one rank file holds."""

    identity: RankInfo
    events: list[Any] = field(default_factory=list)
    done: bool = False  # the rank wrote its end record
    wall_s: float = 0.0
    malformed: int = 0
    path: str = ""


@dataclass
class RunDir:
    ranks: list[RankStream] = field(default_factory=list)
    launch_events: list[Any] = field(default_factory=list)


def read_stream(lines: Iterable[str], path: str = "") -> Optional[RankStream]:
    """A rank's stream from its lines; None when it never said which rank it is."""
    stream: Optional[RankStream] = None
    pending: list[Any] = []
    malformed = 0
    done, wall = False, 0.0
    for line in lines:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            kind = msg.get("type", "")
        except (ValueError, AttributeError):
            malformed += 1
            continue
        if kind == DONE:
            done, wall = True, float((msg.get("data") or {}).get("wall_s") or 0.0)
            continue
        if kind.startswith("__"):
            continue
        try:
            event = decode_event(line)
        except (ValueError, TypeError, KeyError, AttributeError):
            malformed += 1
            continue
        if isinstance(event, RankInfo) and stream is None:
            stream = RankStream(identity=event, path=path)
        else:
            pending.append(event)
    if stream is None:
        return None
    stream.events, stream.done, stream.wall_s, stream.malformed = pending, done, wall, malformed
    return stream


def read_run_dir(path: str) -> RunDir:
    """Every rank file and launch record in `path` (a missing or unreadable
    file is skipped; `merge` then reports the rank as missing)."""
    out = RunDir()
    for name in sorted(glob.glob(os.path.join(path, RANK_GLOB))):
        try:
            with open(name, encoding="utf-8", errors="replace") as f:
                stream = read_stream(f, name)
        except OSError:
            continue
        if stream is not None:
            out.ranks.append(stream)
    for name in sorted(glob.glob(os.path.join(path, LAUNCH_GLOB))):
        try:
            with open(name, encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        out.launch_events.append(decode_event(line))
                    except (ValueError, TypeError, KeyError, AttributeError):
                        continue
        except OSError:
            continue
    out.ranks.sort(key=lambda s: s.identity.rank)
    return out


# -- one rank -----------------------------------------------------------------
def _run_info(events: Iterable[Any]) -> RunInfo:
    """The RunInfo a rank's worker sent (the first one names the target; a
    later one, written when the rank was stopped, only the exit code)."""
    run = RunInfo(target="")
    for event in events:
        if not isinstance(event, RunInfo):
            continue
        for f in dataclasses.fields(RunInfo):
            value = getattr(event, f.name)
            unknown = value is None or value is False or value == "" or value == []  # 0 is an exit code
            if not unknown and (f.name != "target" or not run.target):
                setattr(run, f.name, value)
    return run


def rank_report(stream: RankStream) -> Report:
    """The Report of one rank alone, its RankInfo completed."""
    builder = ReportBuilder(_run_info(stream.events))
    for event in stream.events:
        if not isinstance(event, RunInfo):
            builder.add(event)
    if stream.malformed:
        builder.add(ErrorEntry("internal", f"{stream.malformed} malformed line(s) in {os.path.basename(stream.path)}"))
    rank = stream.identity.rank
    if not stream.done:
        location = faultstack.read_location(fault_file(stream.path)) if stream.path else None
        where = f" while at line {location.line} ({location.function})" if location else ""
        builder.add(ErrorEntry(
            "killed",
            f"rank {rank} ended without an end record{where} (killed with SIGKILL, crashed in native code, "
            "or its file is incomplete)",
            location=location,
        ))
    builder.wall_s = stream.wall_s
    report = builder.build()
    info = dataclasses.replace(stream.identity)
    info.exit_code = report.run.exit_code
    info.wall_s = stream.wall_s
    info.compile_s = report.timings.compile_s
    info.kernel_time_us = round(sum(k.total_time_us for k in report.kernels if k.kind != "collective"), 3)
    info.collective_time_us = round(sum(k.total_time_us for k in report.kernels if k.kind == "collective"), 3)
    if not stream.done or any(e.kind in ("killed", "timeout") for e in report.errors):
        info.status = "killed"
    elif report.run.exit_code:
        info.status = "failed"
    else:
        info.status = "ok"
    report.ranks = [info]
    return report


# -- all ranks ------------------------------------------------------------------
def ranks_label(ranks: list[int]) -> str:
    """`rank 3`, `ranks 0-7`, `ranks 0-2, 5`."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    parts, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


class _Union:
    """Entries from several ranks, one per key, in first-seen order."""

    def __init__(self, key: Callable[[Any], Hashable]) -> None:
        self.key = key
        self.entries: dict[Hashable, Any] = {}

    def add(self, entry: Any, rank: int) -> Any:
        k = self.key(entry)
        seen = self.entries.get(k)
        if seen is None:
            seen = self.entries[k] = dataclasses.replace(entry, ranks=[])
        if rank not in seen.ranks:
            seen.ranks.append(rank)
        return seen

    def values(self) -> list[Any]:
        return list(self.entries.values())


def _break_key(gb: GraphBreak) -> Hashable:
    return gb.key() + (gb.origin,)


def _recompile_key(rc: Recompile) -> Hashable:
    return (rc.function, rc.location.file, rc.location.line, tuple(rc.reasons))


def _error_key(e: ErrorEntry) -> Hashable:
    loc = e.location
    return (e.kind, e.message, loc.file if loc else "", loc.line if loc else 0)


def _split_key(s: DDPSplit) -> Hashable:
    return (s.compile_id, s.function, tuple(b.size_bytes for b in s.buckets))


def merge(rank_reports: list[Report], launch_events: Optional[list[Any]] = None) -> Report:
    """One Report for the whole run from each rank's `rank_report`."""
    breaks, recompiles, errors = _Union(_break_key), _Union(_recompile_key), _Union(_error_key)
    graphs = _Union(lambda g: (g.graph_id, tuple(g.ops)))
    splits = _Union(_split_key)
    fusion: list[Any] = []
    infos = [r.ranks[0] for r in rank_reports]
    for report, info in zip(rank_reports, infos):
        rank = info.rank
        for gb in report.graph_breaks:
            seen = breaks.add(gb, rank)
            seen.count = max(seen.count, gb.count)  # hits per rank, not the sum over ranks
        for rc in report.recompiles:
            recompiles.add(rc, rank)
        for e in report.errors:
            errors.add(e, rank)
        for g in report.graphs:
            graphs.add(g, rank)
        for s in report.ddp_splits:
            splits.add(s, rank)
        for d in report.fusion:
            if d not in fusion:
                fusion.append(d)

    status = {i.rank: i.status for i in infos}
    world = max([i.world_size for i in infos] + [len(infos)])
    missing = sorted(set(range(world)) - set(status))
    divergence = _divergence(breaks.values(), recompiles.values(), status) + _missing_ranks(missing, world)
    slowest_compile = max(rank_reports, key=lambda r: r.timings.compile_s, default=None)
    all_kernels = _summed_kernels(rank_reports)
    merged = Report(
        run=_merged_run(rank_reports, launch_events or []),
        graph_breaks=breaks.values(),
        recompiles=recompiles.values(),
        graphs=graphs.values(),
        kernels=all_kernels,
        fusion=fusion,
        errors=divergence + _launch_errors(launch_events or []) + errors.values(),
        timings=Timings(
            wall_s=max((i.wall_s for i in infos), default=0.0),
            compile_s=max((i.compile_s for i in infos), default=0.0),
            phases=list(slowest_compile.timings.phases) if slowest_compile else [],
            kernel_time_us=round(sum(k.total_time_us for k in all_kernels), 3),
        ),
        ddp_splits=splits.values(),
        ranks=infos + [RankInfo(rank=r, world_size=world, status="missing") for r in missing],
    )
    return merged


def _summed_kernels(rank_reports: list[Report]) -> list[Kernel]:
    """One Kernel per (graph, name) over all ranks: calls and time summed,
    `ranks` the ranks that ran it."""
    kernels: dict[tuple, Kernel] = {}
    for report in rank_reports:
        for k in report.kernels:
            key = (k.graph_id, k.name)
            if key not in kernels:
                kernels[key] = dataclasses.replace(k, ranks=[], calls=0, total_time_us=0.0)
            kernels[key].calls += k.calls
            kernels[key].total_time_us = round(kernels[key].total_time_us + k.total_time_us, 3)
            kernels[key].ranks.append(report.ranks[0].rank)
    return list(kernels.values())


def _missing_ranks(missing: list[int], world: int) -> list[ErrorEntry]:
    """An error for each rank of the world that left no rank file."""
    return [
        ErrorEntry(
            "killed",
            f"rank {rank} of {world} wrote no events: it never started under capture, or its host's "
            "files were not gathered into this directory",
            ranks=[rank],
        )
        for rank in missing
    ]


def _divergence(breaks: list[GraphBreak], recompiles: list[Recompile], status: dict[int, str]) -> list[ErrorEntry]:
    """A divergence error per break or recompile that some ranks did not have,
    counting only absent ranks that ran on (ended ok, or were stopped while
    running): a rank that failed earlier may simply not have got there."""
    out = []
    everyone = sorted(status)
    for kind, items in (("graph break", breaks), ("recompile", recompiles)):
        for item in items:
            absent = [r for r in everyone if r not in item.ranks and status[r] in ("ok", "killed")]
            if not absent:
                continue
            what = item.reason if isinstance(item, GraphBreak) else "; ".join(item.reasons[:1]) or item.function
            out.append(ErrorEntry(
                "divergence",
                f"{kind} on {ranks_label(item.ranks)} only, not on {ranks_label(absent)}: {what}. "
                "Ranks that compile different graphs can run different collectives and hang; "
                "make the code path the same on every rank",
                location=item.location,
                compile_id=item.compile_id,
                ranks=list(item.ranks),
            ))
    return out


def _merged_run(rank_reports: list[Report], launch_events: list[Any]) -> RunInfo:
    runs = [r.run for r in rank_reports]
    run = dataclasses.replace(runs[0]) if runs else RunInfo(target="")
    launched = [e for e in launch_events if isinstance(e, RunInfo)]
    for info in launched:  # the launcher knows the command and torchrun's exit code
        run.target = info.target or run.target
        run.args = list(info.args)  # its target is the whole command line
        run.stdout_tail, run.stderr_tail = info.stdout_tail, info.stderr_tail
        run.exit_code = info.exit_code
    if not launched:
        codes = [r.exit_code for r in runs if r.exit_code]
        run.exit_code = codes[0] if codes else (runs[0].exit_code if runs else None)
    run.max_calls_reached = any(r.max_calls_reached for r in runs)
    return run


def _launch_errors(launch_events: list[Any]) -> list[ErrorEntry]:
    return [e for e in launch_events if isinstance(e, ErrorEntry)]


def merge_run_dir(path: str) -> Report:
    """The merged Report of the run written to directory `path`. Raises
    FileNotFoundError when it holds no rank file."""
    run_dir = read_run_dir(path)
    if not run_dir.ranks:
        raise FileNotFoundError(f"{path}: no {RANK_GLOB} files (is this a fuselens run directory?)")
    return merge([rank_report(s) for s in run_dir.ranks], run_dir.launch_events)
