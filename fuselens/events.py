"""The one event schema of fuselens.

Capture (the worker, the compiler) produces these objects, views (report,
server, TUI) only read them. The JSON report is `Report.to_json()`; the worker
streams single events as JSON lines `{"type": <class name>, "data": {...}}`.

Bump `SCHEMA_VERSION` on any change a reader could notice, and document the
change in docs/events.md. This module must never import torch: the server and
the TUI import it and must stay light.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from fuselens.serialize import from_data, to_data

SCHEMA_VERSION = 1

# "collective": a torch.distributed collective (all_reduce, ...) as the profiler
# timed it; it belongs to no compiled graph (graph_id "").
KernelKind = Literal["triton", "cpp", "extern", "collective"]
FusionVerdict = Literal["fused", "not_fused"]
GraphStage = Literal["dynamo", "aot_inference", "aot_forward", "aot_backward"]
ErrorKind = Literal[
    "exception",  # the user program raised
    "exit",  # the user program called sys.exit with a non-zero code
    "syntax",  # the user program does not parse
    "timeout",  # killed after --timeout seconds
    "killed",  # the worker died (signal, OOM)
    "compile",  # a backend failed to compile a graph (fell back to eager)
    "fallback",  # a kernel or op fell back to ATen/eager, with the reason
    "internal",  # fuselens itself failed; a bug to report
    "divergence",  # distributed: a finding on some ranks only (how compiled jobs deadlock)
]


@dataclass
class SourceLocation:
    """A place in the user's code. For notebooks `file` is the .ipynb path,
    `cell` the 0-based index among code cells and `line` is 1-based within
    the cell."""

    file: str
    line: int
    function: str = ""
    code: str = ""  # the source line text, stripped
    cell: Optional[int] = None
    column: int = 0

    def label(self) -> str:
        where = f"{self.file}:cell{self.cell}" if self.cell is not None else self.file
        return f"{where}:{self.line}"


@dataclass
class FixAdvice:
    """One fix from the catalogue (fuselens/fixcatalog.py, keyed by cause)
    for one finding. `edit` says how the fix changes the program, so that the
    report can verify it and the language server can apply it; advice-only
    fixes have no edit. `preferred` is only ever True for a fix that was
    verified: applied to a copy of the program, re-run, and the program still
    succeeded without the finding it targets."""

    cause: str  # catalogue key, e.g. "input-size", "global-mutated", "item"
    title: str  # one line, imperative
    detail: str = ""  # why it works, in the user's terms
    edit: str = ""  # "mark_dynamic" | "dynamic_true" | "config" | "ignore_logging" | "backend" | "" (advice only)
    args: list[str] = field(default_factory=list)  # mark_dynamic: [name, dim]; config: [name, value]; backend: [name]
    verified: Optional[bool] = None  # None: not tried
    preferred: bool = False
    verify_note: str = ""  # what the verification run showed, one line


ORIGIN_DDP_WRAPPER = "ddp-wrapper"
ORIGIN_OPTIMIZER_STEP = "optimizer-step"


@dataclass
class GraphBreak:
    """Graph breaks at the same location with the same reason are one entry
    with `count` > 1 (the parent merges them)."""

    location: SourceLocation
    reason: str  # Dynamo's "Graph Break Reason", first line
    explanation: str = ""
    hints: list[str] = field(default_factory=list)
    gb_type: str = ""  # registry title, e.g. "Unsupported Tensor.item() call..."
    registry_id: str = ""  # e.g. "GB0124" when torch names it
    compile_id: str = ""  # "frame/compile", e.g. "0/0"
    count: int = 1
    user_stack: list[SourceLocation] = field(default_factory=list)  # outermost first
    ranks: list[int] = field(default_factory=list)  # distributed runs: the ranks that hit it
    # "" for the user's own code; otherwise a break torch makes on purpose in its own
    # code, nothing for the user to fix (capture/break_origin.py): ORIGIN_DDP_WRAPPER
    # inside DistributedDataParallel.forward, ORIGIN_OPTIMIZER_STEP around an optimizer's step.
    origin: str = ""
    fixes: list[FixAdvice] = field(default_factory=list)  # from the fix catalogue, best first
    # The user's own explanation when torch's misleads (optimizer.step()
    # is not a user-inserted graph_break()); torch's text stays in `reason`.
    explained: str = ""

    def key(self) -> tuple:
        return (self.location.file, self.location.line, self.location.cell, self.reason)


@dataclass
class ShapeChange:
    """One input that changed between compiles. `dim` is None for a Python
    scalar (int/float input), otherwise the tensor dimension."""

    input_name: str  # user-facing name: "x", "self.weight", "n"
    dim: Optional[int]
    old: str
    new: str
    became_dynamic: bool = False  # Dynamo marked it dynamic (automatic_dynamic)


@dataclass
class Recompile:
    function: str
    location: SourceLocation  # the compiled function's def line, or the guarded user line
    compile_id: str
    reasons: list[str] = field(default_factory=list)  # guard failures in user terms
    raw_reasons: list[str] = field(default_factory=list)  # as torch wrote them
    shape_changes: list[ShapeChange] = field(default_factory=list)
    dtype_changes: list[str] = field(default_factory=list)
    fix: str = ""  # the fix to consider, one sentence
    hit_limit: bool = False  # recompile_limit reached, Dynamo gave up and runs eager
    # The user line that called the compiled function when this recompile
    # happened (where a mark_dynamic call would go); None when unknown.
    call_site: Optional[SourceLocation] = None
    ranks: list[int] = field(default_factory=list)  # distributed runs: the ranks that recompiled
    fixes: list[FixAdvice] = field(default_factory=list)  # from the fix catalogue, best first
    cause: str = ""  # catalogue key of the failed guard ("input-size", "dtype", ...)


@dataclass
class GraphNode:
    """One FX node of a compiled graph, enough to draw the graph."""

    name: str
    op: str  # placeholder | call_function | call_method | call_module | get_attr | output
    target: str  # "aten.add.Tensor", "torch.sin", "output"
    inputs: list[str] = field(default_factory=list)  # names of input nodes
    location: Optional[SourceLocation] = None  # from node stack_trace, user frame
    kernel: Optional[str] = None  # the kernel this node was fused into
    shape: str = ""  # "[4, 16] f32" when known


@dataclass
class CompiledGraph:
    compile_id: str
    function: str
    location: SourceLocation  # file and first line of the compiled function
    backend: str  # "fuselens", "inductor", "eager", ...
    stage: GraphStage = "dynamo"
    ops: list[str] = field(default_factory=list)  # call targets in order
    nodes: list[GraphNode] = field(default_factory=list)
    graph_id: str = ""  # unique within a run: f"{compile_id}:{stage}"
    ranks: list[int] = field(default_factory=list)  # distributed runs: the ranks that compiled it


@dataclass
class Kernel:
    """A generated kernel or an extern (library) call of a compiled graph.
    Times are totals over all calls, in microseconds; 0 calls when the run
    did not time kernels."""

    name: str
    kind: KernelKind
    backend: str = "fuselens"
    graph_id: str = ""
    ops: list[str] = field(default_factory=list)  # fused ATen ops, in order
    nodes: list[str] = field(default_factory=list)  # FX node names fused here
    source_lines: list[SourceLocation] = field(default_factory=list)
    source: str = ""  # generated code (C++, Triton) or the extern call
    language: str = ""  # "cpp", "python" (Triton), "" for extern
    calls: int = 0
    total_time_us: float = 0.0
    bytes_accessed: Optional[int] = None  # per call, when known
    device: str = "cpu"
    ranks: list[int] = field(default_factory=list)  # distributed runs: calls and time summed over these


@dataclass
class KernelTiming:
    """Incremental timing update streamed by a worker; the parent adds it to
    the matching Kernel (same graph_id and name)."""

    name: str
    graph_id: str
    calls: int
    total_time_us: float


@dataclass
class FusionDecision:
    """One scheduler decision. For `fused`, `nodes` landed in `kernel`; for
    `not_fused`, `nodes` are two nodes (or groups) that shared a buffer and
    `reason` says why they stayed apart, in a user's words."""

    decision: FusionVerdict
    nodes: list[str]
    reason: str
    kernel: Optional[str] = None
    graph_id: str = ""
    rule: str = ""  # the scheduler rule that decided, e.g. "iteration-space"
    locations: list[SourceLocation] = field(default_factory=list)
    option: str = ""  # the compiler option that would change it, if any


@dataclass
class ErrorEntry:
    kind: ErrorKind
    message: str
    location: Optional[SourceLocation] = None  # innermost user frame
    traceback: str = ""
    compile_id: str = ""
    ranks: list[int] = field(default_factory=list)  # distributed runs: the ranks it happened on
    # In the user's terms, when the message alone would mislead: e.g. that it
    # raised inside the compiler and fails only under torch.compile.
    explained: str = ""


@dataclass
class PhaseTime:
    phase: str  # "dynamo", "aot", "lowering", "scheduling", "codegen", "cpp_compile", ...
    seconds: float
    compile_id: str = ""
    # The phase this one lies inside ("backend" for "inductor", "inductor" for
    # "codegen"); "" for the top-level, non-overlapping "dynamo" and "backend".
    parent: str = ""


@dataclass
class Timings:
    wall_s: float = 0.0  # whole run of the user program
    compile_s: float = 0.0  # sum over all compiles
    phases: list[PhaseTime] = field(default_factory=list)
    kernel_time_us: float = 0.0


@dataclass
class RunInfo:
    target: str  # what was run, as the user wrote it
    target_kind: Literal["script", "module", "notebook"] = "script"
    args: list[str] = field(default_factory=list)
    backend: str = ""  # forced backend, "" when the program's own
    torch_version: str = ""
    python_version: str = ""
    device: str = "cpu"
    exit_code: Optional[int] = None
    max_calls_reached: bool = False
    stdout_tail: str = ""
    stderr_tail: str = ""
    # "warm": compile caches as the user has them; "cold": turned off (--cold)
    caches: str = ""
    # How the fixes' verdicts were reached: "" (none to verify), "cached" (all
    # from the verdict cache), "re-run" (all by re-running the program), or
    # "N cached, M re-run"
    fix_verdicts: str = ""


@dataclass
class DDPBucket:
    """One bucket of DDPOptimizer: the parameters whose gradients DDP
    all-reduces together, and the piece of the graph that produces them."""

    size_bytes: int
    params: list[str] = field(default_factory=list)  # FX names of the parameters
    nodes: int = 0  # FX nodes in this piece of the graph


@dataclass
class DDPSplit:
    """Dynamo's DDP optimizer (`torch._dynamo.config.optimize_ddp`) cut one
    compiled graph at DDP bucket boundaries so that gradient all-reduce can
    overlap the backward. Not a graph break: the pieces are compiled from one
    Dynamo trace and the program's Python is not split."""

    compile_id: str
    function: str
    location: SourceLocation
    bucket_cap_mb: float  # DistributedDataParallel(bucket_cap_mb=...) of the module
    first_bucket_cap_mb: float  # DDP's smaller first bucket (comms start early)
    buckets: list[DDPBucket] = field(default_factory=list)  # in forward order
    option: str = ""  # what changes it, one sentence
    ranks: list[int] = field(default_factory=list)


@dataclass
class RankInfo:
    """One rank of a distributed run (torchrun). Each per-rank event stream
    starts with one; the merged Report has one per rank, completed with how
    the rank ended and its times."""

    rank: int  # global rank (RANK)
    local_rank: int = 0  # LOCAL_RANK
    world_size: int = 1  # WORLD_SIZE
    node_rank: int = 0  # GROUP_RANK: which torchrun agent (host) launched it
    host: str = ""
    pid: int = 0
    # Filled when merging: "ok", "failed" (the program raised or exited non-zero),
    # "killed" (a signal, stopped by torchrun or by the timeout) or "missing"
    # (its stream ended without an end record).
    status: str = ""
    exit_code: Optional[int] = None
    wall_s: float = 0.0
    compile_s: float = 0.0
    kernel_time_us: float = 0.0
    collective_time_us: float = 0.0


@dataclass
class Report:
    run: RunInfo
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    graphs: list[CompiledGraph] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    fusion: list[FusionDecision] = field(default_factory=list)
    errors: list[ErrorEntry] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    ddp_splits: list[DDPSplit] = field(default_factory=list)
    ranks: list[RankInfo] = field(default_factory=list)  # empty for a single-process run
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return to_data(self)

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Report":
        version = data.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(f"report schema {version} is newer than this fuselens ({SCHEMA_VERSION})")
        return from_data(cls, data)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        return cls.from_dict(json.loads(text))


# Everything a worker may stream, by name. `PhaseTime` and `RunInfo` travel
# as events too; the parent folds them into `Report`.
EVENT_CLASSES: dict[str, type] = {
    c.__name__: c
    for c in (
        GraphBreak,
        Recompile,
        CompiledGraph,
        Kernel,
        KernelTiming,
        FusionDecision,
        ErrorEntry,
        PhaseTime,
        RunInfo,
        DDPSplit,
        RankInfo,
    )
}


def encode_event(event: Any) -> str:
    """One JSON line for the worker -> parent stream."""
    return json.dumps({"type": type(event).__name__, "data": to_data(event)})


def decode_event(line: str) -> Any:
    """Parse one streamed line back into its dataclass; raises ValueError on
    anything that is not a known event."""
    msg = json.loads(line)
    cls = EVENT_CLASSES.get(msg.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown event type {msg.get('type')!r}")
    return from_data(cls, msg["data"])
