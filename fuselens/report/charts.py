"""Inline SVG bar charts for the HTML report: no script, no external asset,
scales with the page. Every label is escaped here."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

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
