"""What the views show of a distributed run: the ranks (how each ended, its
compile, kernel and collective time, the slowest named), which ranks a
finding is on, and Dynamo's DDP graph splits as bucket boundaries. Pure
functions over `fuselens.events` returning plain lines; the terminal and
Markdown views print them. No torch.
"""

from __future__ import annotations

from typing import Optional

from fuselens import present
from fuselens.events import ORIGIN_DDP_WRAPPER, DDPSplit, GraphBreak, RankInfo, Report
from fuselens.report import common

def ranks_label(ranks: list[int]) -> str:
    """`rank 3`, `ranks 0-7`, `ranks 0-2, 5`."""
    ranks = sorted(set(ranks))
    if not ranks:
        return ""
    parts, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [-1]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def ddp_wrapper_breaks(report: Report) -> list[GraphBreak]:
    return common.by_design_breaks(report, ORIGIN_DDP_WRAPPER)


def slowest(report: Report) -> Optional[RankInfo]:
    ran = [r for r in report.ranks if r.status != "missing"]
    return max(ran, key=lambda r: r.wall_s) if len(ran) > 1 else None


def rank_rows(report: Report) -> list[list[str]]:
    """Header row, then one row per rank."""
    rows = [["rank", "host", "local", "status", "exit", "wall", "compile", "kernels", "collectives"]]
    for r in report.ranks:
        rows.append([
            str(r.rank), r.host or "?", str(r.local_rank), r.status or "?",
            "" if r.exit_code is None else str(r.exit_code),
            present.duration_s(r.wall_s) if r.wall_s else "-",
            present.duration_s(r.compile_s) if r.compile_s else "-",
            present.duration_us(r.kernel_time_us) if r.kernel_time_us else "-",
            present.duration_us(r.collective_time_us) if r.collective_time_us else "-",
        ])
    return rows


def slowest_line(report: Report) -> str:
    worst = slowest(report)
    if worst is None:
        return ""
    others = [r.wall_s for r in report.ranks if r.rank != worst.rank and r.status != "missing"]
    gap = worst.wall_s - min(others) if others else 0.0
    compile_worst = max(report.ranks, key=lambda r: r.compile_s)
    return (f"slowest rank: {worst.rank} (wall {present.duration_s(worst.wall_s)}, "
            f"{present.duration_s(gap)} behind the fastest); longest compile: rank {compile_worst.rank} "
            f"({present.duration_s(compile_worst.compile_s)})")


def split_headline(split: DDPSplit) -> str:
    return (f"{split.function or 'graph'} (compile {split.compile_id}) cut into {len(split.buckets)} pieces at "
            f"DDP bucket boundaries: bucket_cap_mb={split.bucket_cap_mb:g} "
            f"(first bucket {split.first_bucket_cap_mb:g} MB); not graph breaks")


def bucket_lines(split: DDPSplit) -> list[str]:
    out = []
    for i, b in enumerate(split.buckets):
        params = ", ".join(_param_name(p) for p in b.params) or "no parameters"
        out.append(f"bucket {i}: {b.size_bytes / (1024 * 1024):.2f} MB, {common.plural(b.nodes, 'node')}: {params}")
    return out


def wrapper_line(breaks: list[GraphBreak]) -> str:
    hits = common.break_hits(breaks)
    return (f"{common.plural(hits, 'graph break')} inside DistributedDataParallel.forward: Dynamo does not trace "
            "DDP's own wrapper by design and compiles the wrapped module; nothing to fix in the program")


def _param_name(fx_name: str) -> str:
    """`L_self_modules_layers_modules_0_parameters_weight_` -> `layers.0.weight`."""
    name = fx_name
    for prefix in ("L_self_modules_", "L_self_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = name.rstrip("_").replace("_modules_", ".").replace("_parameters_", ".")
    return name
