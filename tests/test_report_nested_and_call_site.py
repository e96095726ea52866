"""Recompile call sites and nested compile phases reach every human format."""

from fuselens.events import PhaseTime, Recompile, Report, RunInfo, SourceLocation, Timings
from fuselens.report.html import render_html
from fuselens.report.markdown import render_markdown
from fuselens.report.terminal import render_terminal


def _report() -> Report:
    rc = Recompile(
        function="forward",
        location=SourceLocation("model.py", 10, "forward"),
        compile_id="0/1",
        reasons=["tensor 'x' size mismatch at dim 0: 4 -> 7"],
        call_site=SourceLocation("train.py", 52, "main"),
    )
    phases = [PhaseTime("backend", 2.0, "0/0"), PhaseTime("cpp_compile_zz", 0.5, "0/0", parent="backend")]
    return Report(run=RunInfo(target="train.py"), recompiles=[rc], timings=Timings(compile_s=2.0, phases=phases))


def test_recompile_call_site_is_shown_in_terminal_markdown_and_html():
    report = _report()
    for text in (render_terminal(report), render_markdown(report), render_html(report)):
        assert "train.py:52" in text


def test_nested_phase_is_listed_under_its_parent_not_added_to_the_total():
    md = render_markdown(_report())
    assert "| &nbsp;&nbsp;└ cpp\\_compile\\_zz | 500 ms | 25% |" in md
    assert "Compile time per phase (2.00 s)" in md  # the child is not added to the total
