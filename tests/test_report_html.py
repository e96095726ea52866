"""The HTML view: one self-contained file, charts, graph pictures coloured
by kernel, escaping, and a plain message where graphviz is missing."""

from __future__ import annotations

import copy
import re
import shutil
from html.parser import HTMLParser

import pytest

from fuselens import present
from fuselens.events import CompiledGraph, ErrorEntry, GraphBreak, GraphNode, Report, RunInfo, SourceLocation
from fuselens.report import common, graph_svg
from fuselens.report.html import render_html
from report_helpers import demo_report

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` is not installed")


class _Collector(HTMLParser):
    """Every tag with its attributes, and the text of <style> blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def parse(html: str) -> _Collector:
    c = _Collector()
    c.feed(html)
    return c


def test_html_is_one_file_with_no_external_assets():
    html = render_html(demo_report())
    c = parse(html)
    tags = [t for t, _ in c.tags]
    assert "script" not in tags and "link" not in tags and "img" not in tags and "iframe" not in tags
    for tag, attrs in c.tags:
        for name in ("src", "srcset", "data", "xlink:href"):
            assert name not in attrs, f"<{tag} {name}=...> loads something"
        if tag == "a":  # navigation links are fine, but never to a stylesheet or script
            assert not attrs.get("href", "").endswith((".css", ".js"))
    style = "".join(c.styles)
    assert "@import" not in style and "url(" not in style
    assert "<!DOCTYPE svg" not in html and "<?xml" not in html  # dot's prolog would name an external DTD


def test_html_has_summary_findings_and_kernel_sources_in_collapsible_blocks():
    html = render_html(demo_report())
    assert "3 graph breaks (7 hits), 3 recompiles (1 hit the limit), 1 error" in html
    assert '<section id="graph-breaks">' in html and '<section id="recompiles">' in html
    assert "&#x27;x&#x27; dim 0: 4 -&gt; 7 (now dynamic)" in html
    # every kernel's source sits inside a <details> block, escaped
    table = html[html.index('<table class="kernels">'):]
    for k in demo_report().kernels:
        i = table.index(f"<code>{k.name}</code>")
        assert "<details><summary>source" in table[i: i + 200]
    assert "tmp_acc0 = max_propagate_nan(tmp_acc0, tmp1);" in html
    assert "x0&lt;static_cast&lt;int64_t&gt;(256L)" in html  # C++ '<' escaped


def test_html_charts_compile_time_per_phase_and_kernel_time_per_kernel():
    report = demo_report()
    html = render_html(report)
    charts = re.findall(r'<svg class="chart".*?</svg>', html, re.S)
    assert len(charts) == 2
    phases, kernels = charts
    for name, secs in common.phase_totals(report):
        assert f">{name}</text>" in phases and present.duration_s(secs) in phases
    widths = [float(w) for w in re.findall(r'<rect [^>]*width="([\d.]+)"', kernels)]
    assert len(widths) == 4 and widths == sorted(widths, reverse=True)  # slowest kernel first, longest bar
    assert "extern_kernels.addmm" in kernels


def test_html_says_when_kernels_were_not_timed():
    report = demo_report()
    for k in report.kernels:
        k.total_time_us, k.calls = 0.0, 0
    report.timings.kernel_time_us = 0.0
    assert "Kernels were not timed in this run." in render_html(report)


@needs_dot
def test_graph_picture_colours_each_node_by_its_kernel():
    report = demo_report()
    html = render_html(report)
    for i, graph in enumerate(report.graphs):
        m = re.search(rf'<article class="graph" id="graph-{i}">.*?</article>', html, re.S)
        assert m, f"graph {i} missing"
        svg = m.group(0)
        assert "<svg" in svg
        colors = common.kernel_colors(report, graph)
        fills = _node_fills(svg, f"graph{i}", graph)
        assert set(fills) == {n.name for n in graph.nodes}
        for node in graph.nodes:
            want = colors[node.kernel] if node.kernel else (
                common.IO_FILL if node.op in ("placeholder", "output") else common.UNFUSED_FILL)
            assert fills[node.name] == want, node.name
        for kernel, color in colors.items():  # the legend names every kernel with its colour
            assert f'background:{color}"></span><code>{kernel}</code>' in svg
    # two kernels of one graph never share a colour
    g = report.graphs[1]
    assert len(set(common.kernel_colors(report, g).values())) == len(common.kernel_colors(report, g))


def _node_fills(svg: str, prefix: str, graph: CompiledGraph) -> dict[str, str]:
    """node name -> fill colour of its shape, read from dot's SVG."""
    out = {}
    for m in re.finditer(rf'<g id="{prefix}&#45;n(\d+)" class="node[^"]*">\s*<title>([^<]*)</title>\s*<(?:path|polygon) fill="([^"]+)"', svg):
        idx, title, fill = int(m.group(1)), m.group(2), m.group(3)
        assert graph.nodes[idx].name == title
        out[title] = fill
    return out


@needs_dot
def test_graph_nodes_are_records_with_name_target_and_user_line():
    report = demo_report()
    svg = graph_svg.draw_graph(report, report.graphs[0], None, "g").svg
    assert svg and svg.startswith("<svg")
    for text in ("addmm", "call_function: aten.addmm.default", "kernel: extern_kernels.addmm", "examples/demo.py:15"):
        assert f">{text}</text>" in svg


def test_graph_picture_message_where_graphviz_is_missing(monkeypatch):
    # No way to uninstall graphviz for one test: hide `dot` from the lookup.
    monkeypatch.setattr(graph_svg, "dot_path", lambda: None)
    html = render_html(demo_report())
    assert html.count("graphviz is not installed") == 2
    assert '<div class="graph-svg">' not in html
    assert "cpp_fused_abs_max_0" in html  # the rest of the page is still there


@needs_dot
def test_dot_labels_escape_record_syntax_and_html_escapes_the_picture():
    nasty = 'a|b{c}<d>"e\\'
    g = CompiledGraph("0/0", "f", SourceLocation("t.py", 1), "inductor", nodes=[
        GraphNode("x", "placeholder", "x"),
        GraphNode("y", "call_function", nasty, ["x"], SourceLocation("t<&>.py", 2), kernel="k<0>"),
    ], graph_id="0/0:dynamo")
    report = Report(run=RunInfo(target="t.py"), graphs=[g])
    pic = graph_svg.draw_graph(report, g)
    assert pic.svg is not None, pic.message
    assert "call_function: a|b{c}&lt;d&gt;&quot;e\\" in pic.svg or "call_function: a|b{c}&lt;d&gt;\"e\\" in pic.svg
    html = render_html(report)
    assert "<d>" not in html and "k<0>" not in html


def test_user_text_is_escaped_everywhere():
    evil = "<img src=x onerror=alert(1)>"
    report = Report(
        run=RunInfo(target=evil, args=[evil]),
        graph_breaks=[GraphBreak(SourceLocation(evil, 3, evil, evil), evil, evil, [evil], count=2)],
        errors=[ErrorEntry("exception", evil, SourceLocation("t.py", 1, "f", evil), evil)],
    )
    html = render_html(report)
    assert "<img" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_too_big_graphs_are_not_drawn_and_say_so():
    nodes = [GraphNode(f"n{i}", "call_function", "aten.add.Tensor") for i in range(graph_svg.MAX_NODES + 1)]
    g = CompiledGraph("0/0", "f", SourceLocation("t.py", 1), "inductor", nodes=nodes, graph_id="0/0:dynamo")
    pic = graph_svg.draw_graph(Report(run=RunInfo(target="t.py"), graphs=[g]), g)
    assert pic.svg is None and f"{graph_svg.MAX_NODES + 1} nodes" in pic.message


def test_a_kernel_keeps_its_colour_across_recompiled_graphs():
    report = demo_report()
    again = copy.deepcopy(report.graphs[0])
    again.compile_id, again.graph_id = "0/1", "0/1:aot_inference"
    report.graphs.append(again)
    first = common.kernel_colors(report, report.graphs[0])
    assert common.kernel_colors(report, again) == first
    other = common.kernel_colors(report, report.graphs[1])
    assert not set(first.values()) & set(other.values())  # different kernels, different colours


def _wide_report() -> Report:
    """Fusion and kernel rows with long unbroken names, reasons and paths:
    what overflowed the page at 1400 px."""
    r = copy.deepcopy(demo_report())
    blocked = next(d for d in r.fusion if d.decision == "not_fused")
    blocked.nodes = ["buf_" + "x" * 150, "buf_" + "y" * 150]
    blocked.reason = "reduction_" + "z" * 180
    blocked.option = "torch._inductor.config." + "w" * 150
    r.kernels[0].name = "cpp_fused_" + "k" * 180
    return r


class _TableParents(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack: list[tuple[str, str]] = []
        self.table_parents: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.table_parents.append(self.stack[-1][1] if self.stack else "")
        if tag not in ("br", "img", "meta", "hr", "input", "link"):
            self.stack.append((tag, dict(attrs).get("class") or ""))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass


def test_wide_tables_wrap_and_scroll_inside_their_box_not_the_page():
    from fuselens.report.html_style import CSS

    html = render_html(_wide_report(), draw=lambda *a: graph_svg.GraphPicture("", "no graphviz"))
    p = _TableParents()
    p.feed(html)
    assert len(p.table_parents) == 2 and set(p.table_parents) == {"table-wrap"}
    css = " ".join(CSS.split())
    assert ".table-wrap { max-width: 100%; overflow-x: auto; }" in css
    cell_rule = re.search(r"th, td \{([^}]*)\}", css).group(1)
    assert "overflow-wrap: anywhere" in cell_rule
    # no cell is forced wider than a column of the 1180 px page
    for width in re.findall(r"min-width:\s*(\d+)em", css):
        assert int(width) <= 16
