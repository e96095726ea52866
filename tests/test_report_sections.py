"""Markdown and HTML use the terminal's severity model and sections: Errors
only for a failed program (or diverged ranks), our backend's fallbacks under
Fallbacks, and each finding's plain-terms explanation and fix list, verified
fixes marked (issue 18)."""

from __future__ import annotations

import copy

import pytest

from fuselens.events import ErrorEntry, FixAdvice, SourceLocation
from fuselens.report.html import render_html
from fuselens.report.markdown import render_markdown
from fuselens.report.terminal import render_terminal
from report_helpers import demo_report

RENDER = {"md": render_markdown, "html": render_html, "terminal": render_terminal}


def fallbacks_only_report():
    r = copy.deepcopy(demo_report())
    r.errors = [ErrorEntry("fallback", "aten.sort runs in ATen between kernels", SourceLocation("examples/demo.py", 20)),
                ErrorEntry("compile", "graph 0/1 ran eagerly after its compile failed")]
    return r


def fixes_report():
    r = fallbacks_only_report()
    r.errors.insert(0, ErrorEntry("exception", "ValueError: boom", SourceLocation("examples/demo.py", 52)))
    gb = r.graph_breaks[0]
    gb.explained = "tokExplainedItemZ: .item() leaves the graph"
    gb.fixes = [FixAdvice("item", "tokVerifiedFixZ", detail="tokBecauseZ", verified=True, preferred=True),
                FixAdvice("item", "tokFailedFixZ", verified=False)]
    r.recompiles[0].fixes = [FixAdvice("input-size", "tokRecompileFixZ", verified=True, preferred=True)]
    return r


@pytest.mark.parametrize("fmt", ["md", "html", "terminal"])
def test_fallbacks_of_a_correct_run_are_under_fallbacks_never_errors(fmt):
    out = RENDER[fmt](fallbacks_only_report())
    assert "Errors (" not in out
    assert "Fallbacks (2)" in out
    assert "warning" in out and "fallback" in out and "eager-fallback" in out


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_errors_section_holds_only_the_failed_program(fmt):
    out = RENDER[fmt](fixes_report())
    assert "Errors (1)" in out and "the program failed" in out and "Fallbacks (2)" in out
    errors = out[out.index("Errors (1)"):out.index("Fallbacks (2)")]
    assert "ValueError: boom" in errors and "aten.sort" not in errors


@pytest.mark.parametrize("fmt", ["md", "html", "terminal"])
def test_graph_breaks_show_the_explanation_and_fixes_with_verified_ones_marked(fmt):
    out = RENDER[fmt](fixes_report(), **({"verbose": True} if fmt == "terminal" else {}))
    assert "tokExplainedItemZ" in out
    assert "torch says" in out  # torch's own text one level down
    verified = out.index("tokVerifiedFixZ")
    assert "fix (verified)" in out[max(0, verified - 120):verified]
    assert "tokBecauseZ" in out
    assert "tokFailedFixZ (tried: did not work)" in out
    recompile_fix = out.index("tokRecompileFixZ")
    assert "fix (verified)" in out[max(0, recompile_fix - 120):recompile_fix]
