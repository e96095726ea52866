"""What the TUI shows, computed from reports. Pure: no Textual, no torch.

A `Report` (fuselens.events) becomes kernel rows, a summary and per-kernel
differences against the previous run. Widgets only format these values, so
every number on screen is tested here without an app.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from fuselens import present
from fuselens.events import ErrorEntry, FusionDecision, Kernel, Report
from fuselens.report.ranks_view import ranks_label

# Error kinds that mean the program did not run to the end; shown as a banner.
FATAL_ERRORS = ("exception", "exit", "syntax", "timeout", "killed", "internal")
# Also in the banner: ranks that compiled different graphs (a torchrun job
# that can deadlock), though the run itself may have ended well.
BANNER_ERRORS = FATAL_ERRORS + ("divergence",)


def kernel_key(kernel: Kernel) -> str:
    """Identity of a kernel across runs: its graph and its name."""
    return f"{kernel.graph_id}/{kernel.name}"


@dataclass(frozen=True)
class KernelRow:
    """One line of the kernel table. Times in microseconds.

    status: "same" (in both runs), "new" (not in the previous run), "gone"
    (only in the previous run; times are the previous ones), "first" (there
    is no previous run)."""

    key: str
    name: str
    kind: str
    backend: str
    graph_id: str
    ops: str
    user_lines: str
    calls: int
    total_us: float
    mean_us: Optional[float]
    share: Optional[float]  # of the run's total kernel time, 0..1
    bandwidth_gbs: Optional[float]  # achieved, when bytes per call are known
    delta_us: Optional[float] = None  # total_us minus the previous run's
    status: str = "first"
    device: str = "cpu"
    # run-to-run spread of total_us measured over repeated runs (None: not measured)
    noise_us: Optional[float] = None
    ranks: str = ""  # torchrun runs: the ranks that ran it ("0-1"); calls and times are their sum

    @property
    def significant(self) -> Optional[bool]:
        """Whether the difference to the previous run exceeds the run-to-run
        noise: True/False, None when no repeated runs measured the noise."""
        if self.delta_us is None or self.status != "same":
            return None
        if self.noise_us is None:
            return None
        return abs(self.delta_us) > self.noise_us


@dataclass(frozen=True)
class Summary:
    """The numbers of the summary line, with the previous run's for deltas."""

    graphs: int
    breaks: int
    recompiles: int
    compile_s: float
    kernel_us: float
    wall_s: float
    steps: int
    kernels: int
    errors: list[ErrorEntry] = field(default_factory=list)

    @property
    def wall_per_step_s(self) -> Optional[float]:
        return self.wall_s / self.steps if self.steps else None


def total_kernel_us(report: Report) -> float:
    """Kernel time of a run: the folded total, else the sum over kernels."""
    return report.timings.kernel_time_us or sum(k.total_time_us for k in report.kernels)


def steps(report: Report) -> int:
    """How many times the compiled code ran: per graph, the fewest calls of
    any timed kernel in it (each call of a graph runs each of its kernels at
    least once); the most over graphs. 0 when nothing was timed."""
    per_graph: dict[str, int] = {}
    for k in report.kernels:
        if k.calls > 0:
            per_graph[k.graph_id] = min(per_graph.get(k.graph_id, k.calls), k.calls)
    return max(per_graph.values(), default=0)


def bandwidth_gbs(kernel: Kernel) -> Optional[float]:
    """Achieved bandwidth in GB/s (bytes per call x calls / time)."""
    if not kernel.bytes_accessed or kernel.calls <= 0 or kernel.total_time_us <= 0:
        return None
    return kernel.bytes_accessed * kernel.calls / (kernel.total_time_us * 1e3)


def user_lines(kernel: Kernel) -> str:
    """`file.py:12,14` for the user lines a kernel came from (basename only:
    the table is narrow; the detail screen shows full paths)."""
    by_file: dict[str, list[str]] = {}
    for loc in kernel.source_lines:
        name = loc.file.rsplit("/", 1)[-1]
        if loc.cell is not None:
            name = f"{name}:cell{loc.cell}"
        lines = by_file.setdefault(name, [])
        if str(loc.line) not in lines:
            lines.append(str(loc.line))
    return " ".join(f"{f}:{','.join(ls)}" for f, ls in by_file.items())


def ranks_cell(ranks: list[int]) -> str:
    """`0-1`, `0-2, 5`: a kernel's ranks for the table's narrow column."""
    label = ranks_label(ranks)
    return label.split(" ", 1)[1] if label else ""


def _row(kernel: Kernel, total: float, previous: Optional[Kernel], status: str) -> KernelRow:
    delta = None
    if previous is not None:
        delta = kernel.total_time_us - previous.total_time_us
    return KernelRow(
        key=kernel_key(kernel),
        name=kernel.name,
        kind=kernel.kind,
        backend=kernel.backend,
        graph_id=kernel.graph_id,
        ops=", ".join(kernel.ops),
        user_lines=user_lines(kernel),
        calls=kernel.calls,
        total_us=kernel.total_time_us,
        mean_us=kernel.total_time_us / kernel.calls if kernel.calls else None,
        share=kernel.total_time_us / total if total > 0 else None,
        bandwidth_gbs=bandwidth_gbs(kernel),
        delta_us=delta,
        status=status,
        device=kernel.device,
        ranks=ranks_cell(kernel.ranks),
    )


def kernel_noise(reports: list[Report], labels: Optional[list[str]] = None) -> dict[str, float]:
    """Run-to-run noise per kernel key, in µs of total time: runs with the
    same label (the same toggles, so the same program and compiler settings)
    are repeated measurements; a kernel's noise is the largest spread
    (max - min of its total time) within any such group of two or more runs.
    Kernels never measured twice have no entry. Labels default to one group."""
    if labels is None:
        labels = [""] * len(reports)
    groups: dict[str, list[Report]] = {}
    for report, label in zip(reports, labels):
        groups.setdefault(label, []).append(report)
    noise: dict[str, float] = {}
    for runs in groups.values():
        if len(runs) < 2:
            continue
        times: dict[str, list[float]] = {}
        for report in runs:
            for k in report.kernels:
                if k.calls > 0:
                    times.setdefault(kernel_key(k), []).append(k.total_time_us)
        for key, values in times.items():
            if len(values) >= 2:
                noise[key] = max(noise.get(key, 0.0), max(values) - min(values))
    return noise


def kernel_rows(report: Report, previous: Optional[Report] = None,
                noise: Optional[dict[str, float]] = None) -> list[KernelRow]:
    """Rows for every kernel of `report`, then the kernels of `previous` that
    are gone. Kernels match by (graph_id, name); if the graph ids changed
    between runs (a reset renumbers them) the name alone is tried. `noise`
    (from `kernel_noise`) sets each row's `noise_us`."""
    rows = _kernel_rows(report, previous)
    if not noise:
        return rows
    return [replace(r, noise_us=noise.get(r.key)) for r in rows]


def _kernel_rows(report: Report, previous: Optional[Report]) -> list[KernelRow]:
    total = total_kernel_us(report)
    rows = []
    if previous is None:
        return [_row(k, total, None, "first") for k in report.kernels]
    prev_by_key = {kernel_key(k): k for k in previous.kernels}
    prev_by_name: dict[str, list[Kernel]] = {}
    for k in previous.kernels:
        prev_by_name.setdefault(k.name, []).append(k)
    matched: set[str] = set()
    for k in report.kernels:
        old = prev_by_key.get(kernel_key(k))
        if old is None:
            old = next((c for c in prev_by_name.get(k.name, []) if kernel_key(c) not in matched), None)
        if old is not None:
            matched.add(kernel_key(old))
            rows.append(_row(k, total, old, "same"))
        else:
            rows.append(_row(k, total, None, "new"))
    for k in previous.kernels:
        if kernel_key(k) not in matched:
            gone = _row(k, total, None, "gone")
            rows.append(
                KernelRow(**{**gone.__dict__, "share": None, "delta_us": -k.total_time_us})
            )
    return rows


SORT_KEYS = {
    "total": lambda r: r.total_us,
    "mean": lambda r: r.mean_us or 0.0,
    "calls": lambda r: r.calls,
    "name": lambda r: r.name,
    "graph": lambda r: (r.graph_id, r.name),
    "kind": lambda r: (r.kind, r.name),
    "delta": lambda r: r.delta_us if r.delta_us is not None and r.significant is not False else 0.0,
    "bandwidth": lambda r: r.bandwidth_gbs or 0.0,
}
# Numbers sort largest first by default, names A..Z.
SORT_DEFAULT_REVERSE = {"name": False, "kind": False, "graph": False}


def sort_rows(rows: list[KernelRow], column: str, reverse: Optional[bool] = None) -> list[KernelRow]:
    """Rows ordered by `column` (a SORT_KEYS name); ties keep name order;
    kernels gone since the previous run come last. `reverse=None` uses the
    natural order of the column."""
    if reverse is None:
        reverse = SORT_DEFAULT_REVERSE.get(column, True)
    by_name = sorted(rows, key=lambda r: (r.name, r.graph_id))
    ordered = sorted(by_name, key=SORT_KEYS[column], reverse=reverse)
    return [r for r in ordered if r.status != "gone"] + [r for r in ordered if r.status == "gone"]


def summarize(report: Report) -> Summary:
    """Summary numbers of one run."""
    return Summary(
        graphs=len({g.graph_id or g.compile_id for g in report.graphs if g.stage != "aot_backward"}),
        breaks=sum(b.count for b in report.graph_breaks),
        recompiles=len(report.recompiles),
        compile_s=report.timings.compile_s,
        kernel_us=total_kernel_us(report),
        wall_s=report.timings.wall_s,
        steps=steps(report),
        kernels=len(report.kernels),
        errors=[e for e in report.errors if e.kind in BANNER_ERRORS],
    )


def decisions_for(report: Report, kernel: Kernel) -> tuple[list[FusionDecision], list[FusionDecision]]:
    """The fusion decisions that made `kernel`: those that fused into it, and
    the `not_fused` pairs that involve one of its nodes (why it stopped
    growing). Decisions without a graph id match any graph."""
    nodes = set(kernel.nodes)

    def same_graph(d: FusionDecision) -> bool:
        return not d.graph_id or not kernel.graph_id or d.graph_id == kernel.graph_id

    fused = [
        d
        for d in report.fusion
        if d.decision == "fused" and same_graph(d) and (d.kernel == kernel.name or (nodes and set(d.nodes) <= nodes))
    ]
    not_fused = [
        d for d in report.fusion if d.decision == "not_fused" and same_graph(d) and nodes & set(d.nodes)
    ]
    return fused, not_fused


def graph_label(graph_id: str) -> str:
    """A kernel's graph for the table: the compile id `0/1` ("frame/compile"),
    with the stage when it is not the forward Dynamo graph (`0/0 bwd`)."""
    cid, _, stage = graph_id.partition(":")
    if stage.startswith("dynamo"):
        return cid + stage[len("dynamo"):]
    short = {"aot_forward": "fwd", "aot_backward": "bwd", "aot_inference": "inf"}.get(stage, stage)
    return f"{cid} {short}".strip()


def find_kernel(report: Optional[Report], key: str) -> Optional[Kernel]:
    if report is None:
        return None
    return next((k for k in report.kernels if kernel_key(k) == key), None)


def delta_text(row: KernelRow) -> tuple[str, str]:
    """The Δ cell of a kernel that ran in both runs, and its tone: "worse",
    "better", "noise" (within the run-to-run noise: `~`) or "unmeasured"
    (no repeated runs yet: the raw difference, with `?`)."""
    if row.delta_us is None:
        return "", "noise"
    base = row.total_us - row.delta_us
    significant = row.significant
    if significant is False:
        return "~", "noise"
    text = format_delta_us(row.delta_us, base)
    if significant is None:
        return f"{text} ?", "unmeasured"
    return text, "worse" if row.delta_us > 0 else "better"


def format_delta_us(delta: Optional[float], base: Optional[float] = None) -> str:
    """"+1.20 ms +15%"; the percentage only when a non-zero base is known."""
    if delta is None:
        return ""
    sign = "+" if delta > 0 else "−" if delta < 0 else "±"
    text = f"{sign}{present.duration_us(abs(delta))}"
    if base:
        text += f" {sign}{abs(delta) / base * 100:.0f}%"
    return text
