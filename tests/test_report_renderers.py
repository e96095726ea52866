"""The terminal, JSON and Markdown views, on the recorded demo report."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys

import pytest

from fuselens.events import ErrorEntry, GraphBreak, Report, RunInfo, SourceLocation
from fuselens.report import common
from fuselens.report.common import failing_findings, parse_fail_on, summary_line
from fuselens.report.html import render_html
from fuselens.report.json_format import render_json
from fuselens.report.markdown import render_markdown
from fuselens.report.sarif import render_sarif
from fuselens.report.terminal import render_terminal
from report_helpers import EXPECTED, demo_report, tokened_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RENDERERS = {
    "terminal": lambda r: render_terminal(r, width=200, verbose=True),
    "md": render_markdown,
    "html": render_html,
    "sarif": lambda r: render_sarif(r, root="/nonexistent-root"),
}


@pytest.mark.parametrize("fmt", sorted(RENDERERS))
def test_renderer_shows_every_field_of_the_findings(fmt):
    report, tokens = tokened_report()
    out = RENDERERS[fmt](report)
    missing = sorted(name for name in EXPECTED[fmt] if tokens.get(name, name) not in out)
    assert not missing, f"{fmt} output lacks: {missing}"


def test_rendering_every_format_never_imports_torch():
    # Views must stay light (the server and TUI use them): a fresh process
    # renders all formats and checks torch was never imported.
    code = (
        "import sys; sys.path.insert(0, 'tests'); from report_helpers import demo_report; "
        "from fuselens.report.cli import render, FORMATS; r = demo_report(); "
        "[render(r, f) for f in FORMATS]; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_json_renderer_is_the_schema_serialisation_of_the_bounded_report():
    report = demo_report()
    out = render_json(report)
    assert out == common.bounded(report).to_json() + "\n"
    assert Report.from_json(out) == common.bounded(report)


def test_terminal_lists_graph_breaks_ruff_style_with_location_source_and_hints():
    out = render_terminal(demo_report(), width=120)
    # path:line: code message, then the source line under a numbered gutter
    assert re.search(r"^examples/demo\.py:16: graph-break ×3 Unsupported Tensor\.item\(\)", out, re.M)
    assert re.search(r"^ 16 \| scale = h\.abs\(\)\.max\(\)\.item\(\)$", out, re.M)
    assert "= hint: Set `torch._dynamo.config.capture_scalar_outputs = True`" in out
    assert "gb0124.html" in out
    # most frequent first; the single data-dependent branch comes last
    assert out.index("demo.py:16: graph-break") < out.index("demo.py:19: graph-break")


def test_terminal_recompile_names_input_dim_and_fix():
    out = render_terminal(demo_report(), width=160, verbose=True)
    assert re.search(r"examples/demo\.py:14: recompile(?: ×\d+)? forward: tensor 'x' size mismatch at dim 0: 4 -> 7", out)
    assert "'x' dim 0: 4 -> 7 (now dynamic)" in out
    assert "= fix: The batch size of 'x' changes between calls: call torch._dynamo.mark_dynamic(x, 0)" in out
    assert re.search(r"examples/demo\.py:33: recompile-limit(?: ×\d+)? scaled", out)
    assert "scalar 'n': 8 -> 9" in out


def test_terminal_shows_kernels_fusion_and_phase_times():
    out = render_terminal(demo_report(), width=200, verbose=True)
    assert "triton_poi_fused_add_cos_mul_pow_relu_sin_0" in out
    assert "examples/demo.py:26,27" in out  # the user lines a kernel came from
    assert re.search(r"not fused\s+addmm \+ abs_1", out)
    assert "to change it: max_autotune=True" in out
    assert re.search(r"cpp_compile\s+█+\s+1\.87 s", out)
    assert out.rstrip().splitlines()[-1].startswith("Summary: 3 graph breaks (7 hits), 3 recompiles")


def test_terminal_cuts_a_combo_kernels_long_op_list_as_a_graphs():
    """A combo kernel of an optimizer step lists each part's ops: hundreds for GPT-2's AdamW."""
    import copy

    from fuselens.report.terminal import MAX_OPS_SHOWN

    r = copy.deepcopy(demo_report())
    k = r.kernels[0]
    k.ops = ["aten.mul.Tensor", "aten.lerp.Scalar"] * 100
    out = render_terminal(r, width=200, verbose=True)
    assert f"... and {200 - MAX_OPS_SHOWN} more" in out
    assert out.count("lerp") == MAX_OPS_SHOWN // 2


def test_terminal_quiet_keeps_only_findings_and_summary():
    out = render_terminal(demo_report(), width=120, quiet=True)
    assert "Graph breaks (3)" in out and "Recompiles (3)" in out and "Errors (1)" in out
    assert "Kernels" not in out and "Compile time per phase" not in out and "Compiled graphs" not in out


def test_terminal_color_adds_ansi_only_when_asked():
    plain = render_terminal(demo_report())
    colored = render_terminal(demo_report(), color=True)
    assert "\x1b[" not in plain
    assert "\x1b[" in colored


def test_terminal_shows_paths_relative_to_root():
    r = Report(run=RunInfo(target="/home/u/proj/train.py"),
               graph_breaks=[GraphBreak(SourceLocation("/home/u/proj/pkg/model.py", 8, "f", "x.item()"), "item")])
    out = render_terminal(r, root="/home/u/proj")
    assert "pkg/model.py:8: graph-break item" in out
    assert "fuselens report train.py" in out


def test_terminal_does_not_interpret_rich_markup_in_user_text():
    r = Report(run=RunInfo(target="t.py"),
               graph_breaks=[GraphBreak(SourceLocation("t.py", 3, "f", "print('[bold red]x[/]')"), "[red]boom[/red]")])
    out = render_terminal(r)
    assert "[red]boom[/red]" in out
    assert "print('[bold red]x[/]')" in out


def test_clean_report_says_there_is_nothing_to_fix():
    out = render_terminal(Report(run=RunInfo(target="clean.py")))
    assert "Summary: no graph breaks, recompiles or errors" in out


def test_markdown_has_sections_tables_and_collapsible_kernel_source():
    md = render_markdown(demo_report())
    assert md.startswith("# fuselens report: `examples/demo.py --steps 3`")
    for heading in ("## Errors (1)", "## Graph breaks (3, 7 hits)", "## Recompiles (3)", "## Compiled graphs (2)",
                    "## Kernels (4)", "## Fusion decisions (3 fused, 2 not fused)", "## Compile time per phase"):
        assert heading in md
    assert "| `addmm` | call\\_function | `aten.addmm.default` | `extern_kernels.addmm` |" in md
    assert "<summary><code>cpp_fused_abs_max_0</code> source</summary>" in md
    assert "```cpp\n#include" in md
    # Dynamo's backtick spans stay code, the rest is escaped prose
    assert "- **why:** Dynamo does not support tracing `Tensor.item()` with config.capture\\_scalar\\_outputs=False." in md


def test_markdown_escapes_pipes_and_html_in_user_text():
    r = Report(run=RunInfo(target="t.py"),
               errors=[ErrorEntry("exception", "ValueError: a|b <script>alert(1)</script>", SourceLocation("t.py", 2))])
    md = render_markdown(r)
    assert "<script>" not in md
    assert "a\\|b \\<script\\>" in md


def test_markdown_code_block_survives_backtick_fences_in_kernel_source():
    r = demo_report()
    r.kernels[1].source = "x = 1\n```\nnot the end\n"
    md = render_markdown(r)
    assert "````cpp\nx = 1\n```\nnot the end\n````" in md


def test_fail_on_categories_match_findings():
    report = demo_report()
    assert failing_findings(report, parse_fail_on("graph-break,recompile")) == ["graph-break", "recompile"]
    assert failing_findings(report, ["fusion-blocked"]) == ["fusion-blocked"]
    assert failing_findings(Report(run=RunInfo(target="t.py")), ["any"]) == []
    with pytest.raises(ValueError, match="unknown category 'graph-breaks'"):
        parse_fail_on("graph-breaks")


def test_summary_line_counts_places_and_hits():
    assert summary_line(demo_report()) == "3 graph breaks (7 hits), 3 recompiles (1 hit the limit), 1 error"


def test_sarif_and_json_outputs_parse_as_json():
    report = demo_report()
    json.loads(render_json(report))
    json.loads(render_sarif(report, root="/x"))


def test_phases_read_in_pipeline_order_whatever_order_they_arrived_in():
    from fuselens.events import PhaseTime, Timings
    from fuselens.report.common import phase_totals

    r = Report(run=RunInfo(target="t.py"), timings=Timings(phases=[
        PhaseTime("codegen", 1.0, "0/0"), PhaseTime("backend", 3.0, "0/0"), PhaseTime("mystery", 0.5, "0/0"),
        PhaseTime("inductor", 2.0, "0/0"), PhaseTime("dynamo", 0.25, "0/0"), PhaseTime("dynamo", 0.25, "1/0"),
    ]))
    assert phase_totals(r) == [("dynamo", 0.5), ("backend", 3.0), ("inductor", 2.0), ("codegen", 1.0), ("mystery", 0.5)]
