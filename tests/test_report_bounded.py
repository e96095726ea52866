"""No value in any report format is longer than 200 characters (issue 18):
a report whose error message, traceback, torch explanation, hint, fix and
guarded `bytes` value are each 5 KB renders, in all five formats, with every
value cut to at most `MAX_TEXT` characters and the cut marked with "…"."""

from __future__ import annotations

import copy
import json
import re

import pytest

from fuselens.capture.guardtext import MAX_TEXT
from fuselens.events import FixAdvice
from fuselens.report import common
from fuselens.report.cli import render
from report_helpers import demo_report

HUGE = 5000


def huge_report():
    r = copy.deepcopy(demo_report())
    err = r.errors[0]
    err.message = "RuntimeError: " + "Q" * HUGE
    err.traceback = "\n".join(f'  File "x.py", line {i}, in f\n    ' + "Q" * 300 for i in range(20)) + "\nRuntimeError: boom"
    gb = r.graph_breaks[0]
    gb.reason = "Q" * HUGE
    gb.explanation = "Q" * HUGE
    gb.explained = "Q" * HUGE
    gb.hints = ["Q" * HUGE, "Q" * HUGE]
    gb.fixes = [FixAdvice("item", "Q" * HUGE, detail="Q" * HUGE, verified=True, preferred=True)]
    rc = r.recompiles[0]
    value = repr(b"Q" * HUGE)  # a bytes value crossing a guard, 5 KB of repr
    rc.reasons = [f"header == {value}"]
    rc.raw_reasons = [f"0/1: L['header'] == {value}  # f.py:8 in encode"]
    rc.fix = "Q" * HUGE
    blocked = next(d for d in r.fusion if d.decision == "not_fused")
    blocked.reason = "Q" * HUGE
    r.run.stdout_tail = ("Q" * 300 + "\n") * 20
    return r


def longest_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"Q+", text)), default=0)


@pytest.mark.parametrize("fmt", ["terminal", "md", "html", "json", "sarif"])
def test_a_5kb_message_explanation_hint_and_bytes_value_render_at_most_200_chars(fmt):
    out = render(huge_report(), fmt, width=1000, verbose=True)  # wide: no wrapping hides a long value
    assert longest_run(out) > 100, "the long values are shown (cut), not dropped"
    assert longest_run(out) <= MAX_TEXT
    assert "…" in out or "\\u2026" in out
    if fmt == "terminal":
        # each value is at most MAX_TEXT; a line adds at most its label and location
        assert max(len(line) for line in out.splitlines()) <= MAX_TEXT + 80


def test_json_report_has_no_string_value_over_200_chars_except_kernel_code():
    data = json.loads(render(huge_report(), "json"))

    def strings(node, key=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from strings(v, k)
        elif isinstance(node, list):
            for v in node:
                yield from strings(v, key)
        elif isinstance(node, str):
            yield key, node

    long = [(k, len(v)) for k, v in strings(data) if len(v) > MAX_TEXT and k not in common.UNCLIPPED_FIELDS]
    assert long == []
    err = data["errors"][0]
    assert err["traceback"].startswith("…") and err["traceback"].endswith("RuntimeError: boom")  # its end is kept


def test_every_sarif_message_text_is_at_most_200_chars():
    log = json.loads(render(huge_report(), "sarif"))

    def texts(node):
        if isinstance(node, dict):
            if isinstance(node.get("message"), dict):
                yield node["message"]["text"]
            for v in node.values():
                yield from texts(v)
        elif isinstance(node, list):
            for v in node:
                yield from texts(v)

    found = list(texts(log["runs"][0]))
    assert found and max(len(t) for t in found) <= MAX_TEXT


def test_bounding_leaves_short_values_paths_and_kernel_code_unchanged():
    r = demo_report()
    b = common.bounded(r)
    assert b.to_json() == common.bounded(b).to_json()
    assert [k.source for k in b.kernels] == [k.source for k in r.kernels]
    assert b.errors[0].message == r.errors[0].message
