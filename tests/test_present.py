"""One way to write times, op names and places (`fuselens.present`), used by
the report, the editor's hovers and lenses, and the TUI."""

from __future__ import annotations

from fuselens import present
from fuselens.events import Kernel, Report, RunInfo, SourceLocation
from fuselens.report.html import render_html
from fuselens.report.markdown import render_markdown
from fuselens.report.terminal import render_terminal


def test_durations_have_three_significant_digits_in_every_unit():
    assert [present.duration_us(us) for us in (0, 45.23, 812.4, 1234, 12_345, 123_456, 1.5e6, 12.34e6)] == [
        "0 µs", "45.2 µs", "812 µs", "1.23 ms", "12.3 ms", "123 ms", "1.50 s", "12.3 s",
    ]
    assert present.duration_s(0.001234) == present.duration_us(1234)
    assert present.duration_us(None) == present.duration_s(None) == "—"


def test_op_names_lose_namespace_and_uninformative_overload():
    assert present.short_op("aten.native_layer_norm.default") == "native_layer_norm"
    assert present.short_op("aten.add.Tensor") == "add"
    assert present.short_op("aten.var_mean.correction") == "var_mean.correction"
    assert present.short_op("torch.nn.functional.relu") == "nn.functional.relu"
    assert present.short_op("my_op") == "my_op"


def test_locations_are_file_line_relative_to_the_root_with_notebook_cells():
    assert present.location_label(SourceLocation("/w/pkg/m.py", 12), "/w") == "pkg/m.py:12"
    assert present.location_label(SourceLocation("/elsewhere/m.py", 3), "/w") == "/elsewhere/m.py:3"
    assert present.location_label(SourceLocation("/w/nb.ipynb", 4, cell=2), "/w") == "nb.ipynb:cell2:4"
    assert present.location_label(None) == ""
    assert present.short_location("/w/pkg/m.py", 12) == "m.py:12"


def test_a_kernel_time_reads_the_same_in_report_hover_and_tui(tmp_path):
    """The bug: 1234 µs read "1.2 ms" in the report and "1.23 ms" in the
    hover and the TUI."""
    from fuselens.server.insights import hover
    from fuselens.server.program import ProgramText
    from fuselens.server.resolve import Resolver
    from fuselens.tui.detail import kernel_header

    path = str(tmp_path / "t.py")
    source = "y = x.sin() + 1\n"
    kernel = Kernel(name="cpp_fused_add_0", kind="cpp", device="cpu", calls=2, total_time_us=1234.0,
                    source_lines=[SourceLocation(path, 1)])
    report = Report(run=RunInfo(target=path), kernels=[kernel])
    for text in (render_terminal(report, color=False), render_markdown(report), render_html(report)):
        assert "1.23 ms" in text and "1.2 ms" not in text
    assert "1.23 ms" in kernel_header(kernel).plain
    resolver = Resolver(ProgramText.for_script(path, "file:///t.py", source), [str(tmp_path)])
    shown = hover(report, resolver, [], "file:///t.py", 0)
    assert shown is not None and "1.23 ms" in shown.contents.value
