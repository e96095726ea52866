"""The kernel screen (Enter on a kernel): its generated source, syntax
highlighted, and the fusion decisions that made it, including the pairs
that were not fused and why."""

from __future__ import annotations

from typing import Optional

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from fuselens import present
from fuselens.events import FusionDecision, Kernel, Report
from fuselens.tui.model import bandwidth_gbs, decisions_for

# Kernel.language -> a pygments lexer name.
LEXERS = {"cpp": "cpp", "c++": "cpp", "python": "python", "triton": "python", "cuda": "cuda"}


def kernel_header(kernel: Kernel) -> Text:
    """Name, kind, graph, timing and the user lines of one kernel."""
    text = Text.assemble((kernel.name, "bold"), f"  {kernel.kind} · {kernel.backend} · graph {kernel.graph_id}")
    mean = kernel.total_time_us / kernel.calls if kernel.calls else None
    text.append(f"\n{kernel.calls} calls · total {present.duration_us(kernel.total_time_us)} · mean {present.duration_us(mean)}")
    bw = bandwidth_gbs(kernel)
    if bw is not None:
        text.append(f" · {bw:.1f} GB/s ({kernel.bytes_accessed} B per call)")
    if kernel.ops:
        text.append("\nops: " + ", ".join(kernel.ops), "dim")
    for loc in kernel.source_lines:
        text.append(f"\n{loc.label()}", "cyan")
        if loc.code:
            text.append(f"  {loc.code}", "dim")
    return text


def _decision(text: Text, d: FusionDecision) -> None:
    mark, style = ("✓ fused", "green") if d.decision == "fused" else ("✗ not fused", "red")
    text.append(f"{mark} ", style)
    text.append(" + ".join(d.nodes), "bold")
    if d.rule:
        text.append(f"  [{d.rule}]", "dim")
    text.append(f"\n  {d.reason}\n")
    where = sorted({loc.label() for loc in d.locations})
    if where:
        text.append("  at " + ", ".join(where) + "\n", "cyan")
    if d.option:
        text.append(f"  option: {d.option}\n", "yellow")


def decisions_text(report: Report, kernel: Kernel) -> Text:
    """Fused decisions, then not-fused pairs, in a user's words."""
    fused, not_fused = decisions_for(report, kernel)
    text = Text()
    text.append(f"Fused into this kernel ({len(fused)})\n", "bold underline")
    for d in fused:
        _decision(text, d)
    if not fused:
        text.append("  no fusion decisions recorded" + (" (an extern call)" if kernel.kind == "extern" else "") + "\n",
                    "dim")
    text.append(f"\nNot fused, and why ({len(not_fused)})\n", "bold underline")
    for d in not_fused:
        _decision(text, d)
    if not not_fused:
        text.append("  none recorded\n", "dim")
    return text


class KernelScreen(Screen):
    """Full-screen view of one kernel; Escape goes back."""

    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def __init__(self, report: Report, kernel: Kernel, previous: Optional[Kernel] = None) -> None:
        super().__init__()
        self.report = report
        self.kernel = kernel
        self.previous = previous

    def compose(self) -> ComposeResult:
        yield Static(kernel_header(self.kernel), id="kernel-header")
        with Horizontal(id="kernel-body"):
            with VerticalScroll(id="kernel-source"):
                source = self.kernel.source or "(no generated source recorded)"
                lexer = LEXERS.get(self.kernel.language.lower(), "text" if not self.kernel.source else "python")
                yield Static(Syntax(source, lexer, line_numbers=True, word_wrap=False, theme="monokai"),
                             id="kernel-code")
            with VerticalScroll(id="kernel-fusion"):
                yield Static(decisions_text(self.report, self.kernel), id="kernel-decisions")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#kernel-source").border_title = f"generated source ({self.kernel.language or 'extern call'})"
        self.query_one("#kernel-fusion").border_title = "fusion decisions"
        self.query_one("#kernel-source").focus()
