"""Inline SVG bar charts for the HTML report: no script, no external asset,
scales with the page. Every label is escaped here."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

ROW_H = 22
BAR_H = 14
LABEL_W = 340
VALUE_W = 90
CHAR_W = 7.4  # 12px monospace label font, for truncation


@dataclass
class Bar:
    label: str
    value: float
    text: str  # the value as shown, "1.87 s"
    tooltip: str = ""
    color: str = "#4e79a7"
    depth: int = 0  # nesting level: a child phase is drawn indented under its parent


def phase_rows(report: Any) -> list[tuple[str, float, int]]:
    """Compile phases as a tree, flattened: (phase, seconds summed over all
    compiles, depth), each child right under its parent (PhaseTime.parent).

    A child's time lies inside its parent's; rows are never added up (the
    total is Timings.compile_s, the top-level phases)."""
    from fuselens.report import common  # pure, no torch

    totals: dict[tuple[str, str], float] = {}
    for p in report.timings.phases:
        key = (p.phase, getattr(p, "parent", "") or "")
        totals[key] = totals.get(key, 0.0) + p.seconds
    rank = {name: i for i, name in enumerate(common.PHASE_ORDER)}
    seen = list(totals)
    ordered = sorted(totals, key=lambda k: (rank.get(k[0], len(rank)), seen.index(k)))
    names = {phase for phase, _ in totals}
    children: dict[str, list[tuple[str, str]]] = {}
    roots = []
    for key in ordered:
        phase, parent = key
        if parent and parent in names and parent != phase:
            children.setdefault(parent, []).append(key)
        else:
            roots.append(key)  # top level, or its parent was never recorded
    rows: list[tuple[str, float, int]] = []
    done: set[tuple[str, str]] = set()

    def visit(key: tuple[str, str], depth: int) -> None:
        if key in done:
            return
        done.add(key)
        rows.append((key[0], totals[key], depth))
        for child in children.get(key[0], []):
            visit(child, depth + 1)

    for key in roots:
        visit(key, 0)
    for key in ordered:  # a cycle of parents: shown flat rather than lost
        visit(key, 0)
    return rows


def phase_bars(report: Any, color: str = "#4e79a7") -> list[Bar]:
    """Bars of `phase_rows`, children indented (the HTML compile-time chart)."""
    from fuselens import present

    return [Bar(name, secs, present.duration_s(secs), color=color, depth=depth) for name, secs, depth in phase_rows(report)]


def bar_chart(bars: list[Bar], *, title: str, width: int = 900) -> str:
    """Horizontal bars, one row per item, longest bar = full plot width."""
    if not bars:
        return ""
    plot_w = width - LABEL_W - VALUE_W
    biggest = max(b.value for b in bars) or 1.0
    height = ROW_H * len(bars) + 8
    max_chars = int((LABEL_W - 12) / CHAR_W)
    out = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for i, b in enumerate(bars):
        y = 4 + i * ROW_H
        w = max(1.0, plot_w * b.value / biggest) if b.value > 0 else 0.0
        label = b.label if len(b.label) <= max_chars else b.label[: max_chars - 1] + "…"
        label = "\u00a0\u00a0\u00a0" * b.depth + ("└ " if b.depth else "") + label  # children under their parent
        tip = escape(b.tooltip or f"{b.label}: {b.text}")
        out.append(f"<g><title>{tip}</title>")
        out.append(
            f'<text x="{LABEL_W - 8}" y="{y + BAR_H - 3}" text-anchor="end" class="chart-label">{escape(label)}</text>'
        )
        out.append(f'<rect x="{LABEL_W}" y="{y}" width="{w:.1f}" height="{BAR_H}" rx="2" fill="{escape(b.color)}"/>')
        out.append(f'<text x="{LABEL_W + w + 6:.1f}" y="{y + BAR_H - 3}" class="chart-value">{escape(b.text)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)
