"""What every renderer needs from a Report, computed once: display paths,
units, phase totals, counts, the `--fail-on` categories, per-kernel colours.

Pure functions over `fuselens.events`; no I/O, no torch.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Iterable, Optional

from fuselens.capture.guardtext import MAX_TEXT, clip as clip_text  # noqa: F401  (one home for the limit)
from fuselens import present
from fuselens.events import (
    CompiledGraph,
    ErrorEntry,
    FixAdvice,
    FusionDecision,
    GraphBreak,
    Kernel,
    Recompile,
    Report,
    ShapeChange,
)

GRAPH_BREAK_SITE = "https://meta-pytorch.github.io/compile-graph-break-site/gb/"
DOCS = "https://docs.pytorch.org/docs/stable/"
GRAPH_BREAK_DOCS = DOCS + "compile/programming_model.graph_breaks_index.html"
RECOMPILE_DOCS = DOCS + "compile/programming_model.recompilation.html"
TROUBLESHOOTING_DOCS = DOCS + "torch.compiler_troubleshooting.html"

# Pipeline order, so phases read top to bottom as the compiler runs them;
# unknown phases follow in the order they first appear. Capture may record
# nested phases (backend contains inductor contains codegen): the chart shows
# each as recorded and the total is Timings.compile_s, never their sum.
PHASE_ORDER = (
    "dynamo",
    "backend",
    "aot",
    "inductor",
    "lowering",
    "scheduling",
    "fusion",
    "codegen",
    "cpp_compile",
    "triton_compile",
    "compile",
)

# `--fail-on` categories and what each one counts. `error` is only a program
# that failed (raised, exited non-zero, hung, crashed) or a distributed run
# whose ranks diverged (different graphs per rank: the job can deadlock);
# what fell back and still ran correctly has its own category.
FAIL_CATEGORIES = ("graph-break", "recompile", "recompile-limit", "error", "fallback", "eager-fallback",
                   "internal", "fusion-blocked", "any")

# ErrorEntry.kind -> its severity category. Only FAILURE_KINDS are errors.
FAILURE_KINDS = ("exception", "exit", "syntax", "timeout", "killed", "divergence")
NOTE_CATEGORY = {
    "fallback": "fallback",  # an op runs in ATen between our kernels: correct, maybe slower
    "compile": "eager-fallback",  # a graph ran eagerly after its compile failed: correct, slower
    "internal": "internal",  # fuselens misread something: a fuselens bug, not the program's
}

# Colour-blind friendly pastel palette (Tableau 20 light tones) for kernels.
KERNEL_PALETTE = (
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
    "#c7c7c7",
    "#fdd0a2",
    "#c6dbef",
)
UNFUSED_FILL = "#ffffff"
IO_FILL = "#eeeeee"


# Fields that are not free text and keep their full value: paths (SARIF
# maps them to URIs) and generated kernel code (a program, shown collapsed).
UNCLIPPED_FIELDS = frozenset({"file", "target", "source"})
# Multi-line text whose end matters most (the exception, the last output):
# its last lines are kept, whole lines, MAX_TEXT characters in all.
TAIL_FIELDS = frozenset({"traceback", "stdout_tail", "stderr_tail"})


def clip_tail(text: str, limit: int = MAX_TEXT) -> str:
    """The last lines of `text` that fit in `limit` characters, each line
    clipped, "…" first when anything was dropped."""
    text = str(text).rstrip()
    if len(text) <= limit:
        return text
    kept: list[str] = []
    size = 2  # the "…" line
    for line in reversed([ln for ln in text.splitlines() if ln.strip()]):
        line = clip_text(line, limit - 2)
        if kept and size + len(line) + 1 > limit:
            break
        kept.insert(0, line)
        size += len(line) + 1
    return "\n".join(["…", *kept])


def bounded(report: Report) -> Report:
    """A copy of `report` where no value is longer than MAX_TEXT characters
    (one home for the rule: every renderer starts from this). Long text keeps
    its start and ends in "…"; tracebacks and program output keep their end.
    Short values are unchanged."""
    out = copy.deepcopy(report)
    _bound(out)
    return out


def _bound(obj: object) -> None:
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in UNCLIPPED_FIELDS:
            continue
        if isinstance(value, str):
            if len(value) > MAX_TEXT:
                setattr(obj, f.name, clip_tail(value) if f.name in TAIL_FIELDS else clip_text(value))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str) and len(item) > MAX_TEXT:
                    value[i] = clip_text(item)
                else:
                    _bound(item)
        elif isinstance(value, dict):
            for k, item in value.items():
                if isinstance(item, str) and len(item) > MAX_TEXT:
                    value[k] = clip_text(item)
                else:
                    _bound(item)
        else:
            _bound(value)


def plural(n: int, word: str, many: Optional[str] = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def phase_totals(report: Report) -> list[tuple[str, float]]:
    """Compile seconds per phase summed over all compiles, pipeline order."""
    totals: dict[str, float] = {}
    for p in report.timings.phases:
        totals[p.phase] = totals.get(p.phase, 0.0) + p.seconds
    rank = {name: i for i, name in enumerate(PHASE_ORDER)}
    seen = list(totals)
    return sorted(totals.items(), key=lambda kv: (rank.get(kv[0], len(rank)), seen.index(kv[0])))


def compile_seconds(report: Report) -> float:
    """Total compile time: the recorded total, else the sum of phases."""
    return report.timings.compile_s or sum(p.seconds for p in report.timings.phases)


def run_facts(report: Report) -> list[str]:
    """The run's facts as every format's header lists them (plain text: each format escapes)."""
    run = report.run
    facts = [f"torch {run.torch_version}"] if run.torch_version else []
    if run.python_version:
        facts.append(f"Python {run.python_version}")
    facts.append(f"backend {run.backend or 'as in the program'}")
    if run.device:
        facts.append(run.device)
    if run.exit_code is not None:
        facts.append(f"exit code {run.exit_code}")
    if report.timings.wall_s:
        facts.append(f"wall {present.duration_s(report.timings.wall_s)}")
    if compile_seconds(report):
        facts.append(f"compile {present.duration_s(compile_seconds(report))}")
    if run.caches:
        facts.append(f"{run.caches} caches")
    if run.fix_verdicts:
        facts.append(f"fix verdicts {run.fix_verdicts}")
    if run.max_calls_reached:
        facts.append("stopped at --max-calls")
    return facts


def kernel_time_us(report: Report) -> float:
    return report.timings.kernel_time_us or sum(k.total_time_us for k in report.kernels)


def kernels_by_time(report: Report) -> list[Kernel]:
    """Timed kernels, slowest first."""
    return sorted((k for k in report.kernels if k.total_time_us > 0), key=lambda k: -k.total_time_us)


def kernels_of(report: Report, graph: CompiledGraph) -> list[Kernel]:
    return [k for k in report.kernels if k.graph_id and k.graph_id == graph.graph_id]


def kernel_colors(report: Report, graph: CompiledGraph) -> dict[str, str]:
    """Kernel name -> fill colour for the kernels of one graph, in the order
    its nodes first use them."""
    colors = all_kernel_colors(report)
    names: list[str] = []
    for node in graph.nodes:
        if node.kernel and node.kernel not in names:
            names.append(node.kernel)
    names += [k.name for k in kernels_of(report, graph) if k.name not in names]
    return {name: colors[(graph.graph_id, name)] for name in names}


def all_kernel_colors(report: Report) -> dict[tuple[str, str], str]:
    """(graph_id, kernel name) -> fill colour. Colours follow the kernel
    *name* across the whole report: a recompile's graph shows the same kernel
    in the same colour, and kernels of one graph (distinct names) differ
    until the palette wraps."""
    keys: list[tuple[str, str]] = []
    for graph in report.graphs:
        keys += [(graph.graph_id, n.kernel) for n in graph.nodes if n.kernel]
        keys += [(graph.graph_id, k.name) for k in kernels_of(report, graph)]
    keys += [(k.graph_id, k.name) for k in report.kernels]  # kernels of graphs not recorded
    by_name: dict[str, str] = {}
    for _, name in keys:
        if name not in by_name:
            by_name[name] = KERNEL_PALETTE[len(by_name) % len(KERNEL_PALETTE)]
    return {key: by_name[key[1]] for key in keys}


def graph_title(graph: CompiledGraph) -> str:
    stage = "" if graph.stage == "dynamo" else f" [{graph.stage}]"
    return f"{graph.function} (compile {graph.compile_id}){stage}"


def gb_doc_url(gb: GraphBreak) -> str:
    """The graph-break registry page for this break, else the general docs."""
    rid = gb.registry_id.upper()
    if rid.startswith("GB") and rid[2:].isdigit():
        return f"{GRAPH_BREAK_SITE}gb{rid[2:]}.html"
    return GRAPH_BREAK_DOCS


def shape_change_text(sc: ShapeChange) -> str:
    """'x' dim 0: 4 -> 7 (now dynamic), or scalar 'n': 8 -> 9."""
    what = f"'{sc.input_name}' dim {sc.dim}" if sc.dim is not None else f"scalar '{sc.input_name}'"
    tail = " (now dynamic)" if sc.became_dynamic else ""
    return f"{what}: {sc.old} -> {sc.new}{tail}"


def recompile_headline(rc: Recompile) -> str:
    """One line saying what changed, preferring the user-terms reason."""
    if rc.reasons:
        return rc.reasons[0]
    if rc.shape_changes:
        return shape_change_text(rc.shape_changes[0])
    if rc.dtype_changes:
        return rc.dtype_changes[0]
    return rc.raw_reasons[0] if rc.raw_reasons else "guard failed"


@dataclass(frozen=True)
class Counts:
    graph_breaks: int  # distinct places
    graph_break_hits: int  # summed counts
    recompiles: int
    recompile_limits: int
    graphs: int
    kernels: int
    fused: int
    not_fused: int
    errors: int
    notes: int = 0


def is_failure(err: ErrorEntry) -> bool:
    """True when the program failed (its result is missing or wrong)."""
    return err.kind in FAILURE_KINDS


def failures(report: Report) -> list[ErrorEntry]:
    return [e for e in report.errors if is_failure(e)]


def notes(report: Report) -> list[ErrorEntry]:
    """Fallbacks and fuselens' own notes: findings, not errors."""
    return [e for e in report.errors if not is_failure(e)]


def errors_detail(errors: list[ErrorEntry]) -> str:
    """Why the Errors section exists: a failed program, diverged ranks, or both."""
    diverged = any(e.kind == "divergence" for e in errors)
    failed = any(e.kind != "divergence" for e in errors)
    return ("the program failed; its ranks diverged (the job can deadlock)" if diverged and failed
            else "ranks diverged: the job can deadlock" if diverged else "the program failed")


NOTES_DETAIL = "the program ran correctly; these may cost speed"


def note_category(err: ErrorEntry) -> str:
    """The `--fail-on` category of a fallback or note ("fallback", ...)."""
    return NOTE_CATEGORY.get(err.kind, "internal")


def fix_label(fix: FixAdvice) -> tuple[str, str]:
    """(label, text) of a catalogue fix as every format shows it: a verified
    fix is "fix (verified)"; one that was tried and failed says so."""
    if fix.preferred:
        return "fix (verified)", fix.title
    return "fix", fix.title + (" (tried: did not work)" if fix.verified is False else "")


def group_fixes(group: list[Recompile]) -> list[FixAdvice]:
    """The fixes of a group of recompiles, each once, verified ones first."""
    fixes: list[FixAdvice] = []
    for rc in group:
        fixes += [f for f in rc.fixes if all(f.title != g.title for g in fixes)]
    return sorted(fixes, key=lambda f: not f.preferred)


def program_breaks(report: Report) -> list[GraphBreak]:
    """The program's graph breaks: the findings. Those torch makes on purpose in its own code
    (GraphBreak.origin: DDP's forward wrapper, an optimizer's step) are not."""
    return [gb for gb in report.graph_breaks if not gb.origin]


def by_design_breaks(report: Report, origin: str) -> list[GraphBreak]:
    return [gb for gb in report.graph_breaks if gb.origin == origin]


def break_hits(breaks: list[GraphBreak]) -> int:
    """How often these graph breaks were hit (an entry counts once at least)."""
    return sum(max(gb.count, 1) for gb in breaks)


def counts(report: Report) -> Counts:
    breaks = program_breaks(report)
    return Counts(
        graph_breaks=len(breaks),
        graph_break_hits=break_hits(breaks),
        recompiles=len(report.recompiles),
        recompile_limits=sum(1 for r in report.recompiles if r.hit_limit),
        graphs=len(report.graphs),
        kernels=len(report.kernels),
        fused=sum(1 for f in report.fusion if f.decision == "fused"),
        not_fused=sum(1 for f in report.fusion if f.decision == "not_fused"),
        errors=len(failures(report)),
        notes=len(notes(report)),
    )


def summary_line(report: Report) -> str:
    """'3 graph breaks (7 hits), 2 recompiles, 1 error' or 'no findings'."""
    c = counts(report)
    parts = []
    if c.graph_breaks:
        hits = f" ({c.graph_break_hits} hits)" if c.graph_break_hits != c.graph_breaks else ""
        parts.append(plural(c.graph_breaks, "graph break") + hits)
    if c.recompiles:
        limit = f" ({c.recompile_limits} hit the limit)" if c.recompile_limits else ""
        parts.append(plural(c.recompiles, "recompile") + limit)
    if c.errors:
        parts.append(plural(c.errors, "error"))
    if c.notes:
        parts.append(plural(c.notes, "fallback note"))
    return ", ".join(parts) if parts else "no graph breaks, recompiles or errors"


def parse_fail_on(text: str) -> list[str]:
    """'graph-break,recompile' -> categories; ValueError names a bad one."""
    cats = [c.strip() for c in text.split(",") if c.strip()]
    for c in cats:
        if c not in FAIL_CATEGORIES:
            raise ValueError(f"--fail-on: unknown category {c!r} (choose from {', '.join(FAIL_CATEGORIES)})")
    return cats


def failing_findings(report: Report, categories: Iterable[str]) -> list[str]:
    """The categories in `categories` that the report has findings for."""
    c = counts(report)
    have = {
        "graph-break": c.graph_breaks > 0,
        "recompile": c.recompiles > 0,
        "recompile-limit": c.recompile_limits > 0,
        "error": c.errors > 0,
        "fusion-blocked": c.not_fused > 0,
    }
    for err in notes(report):
        have[NOTE_CATEGORY.get(err.kind, "internal")] = True
    cats = set(categories)
    if "any" in cats:
        cats |= {"graph-break", "recompile", "error"}
    return [name for name in FAIL_CATEGORIES if name in cats and have.get(name)]


def recompiles_by_function(recompiles: list[Recompile]) -> list[list[Recompile]]:
    """Recompiles grouped by compiled code (file and def line, not name),
    in order of first appearance; each group in compile order."""
    groups: dict[tuple, list[Recompile]] = {}
    for rc in recompiles:
        key = (rc.location.file, rc.location.line, rc.location.cell)
        groups.setdefault(key, []).append(rc)
    return list(groups.values())


def merged_kernels(kernels: list[Kernel]) -> list[Kernel]:
    """Kernels of recompiled graphs share names: one entry per (name, kind,
    device) with calls and times added and `graph_id` listing the compiles.
    Slowest first, then in order of appearance."""
    merged: dict[tuple, Kernel] = {}
    for k in kernels:
        key = (k.name, k.kind, k.device)
        cid = k.graph_id.split(":")[0] if k.graph_id else ""
        if key not in merged:
            merged[key] = dataclasses.replace(k, graph_id=cid, source_lines=list(k.source_lines),
                                              ranks=list(k.ranks))
            continue
        m = merged[key]
        m.calls += k.calls
        m.total_time_us += k.total_time_us
        if cid and cid not in m.graph_id.split(", "):
            m.graph_id = f"{m.graph_id}, {cid}" if m.graph_id else cid
        m.source_lines += [s for s in k.source_lines if s not in m.source_lines]
        m.ranks += [r for r in k.ranks if r not in m.ranks]
    order = list(merged.values())
    return sorted(order, key=lambda k: (-k.total_time_us, order.index(k)))


def blocked_reasons(blocked: list[FusionDecision]) -> list[tuple[tuple[str, str], int]]:
    """Not-fused decisions counted by rule (the first reason stands for the
    others: they differ only in node names), most frequent first."""
    count: dict[str, int] = {}
    first: dict[str, str] = {}
    for d in blocked:
        key = d.rule or d.reason
        count[key] = count.get(key, 0) + 1
        first.setdefault(key, d.reason)
    return sorted((((k if k != first[k] else "", first[k]), n) for k, n in count.items()), key=lambda kv: -kv[1])
