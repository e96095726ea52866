"""A compiled graph as a picture: DOT source in the style of torch's
`FxGraphDrawer` (record nodes: name, op and target, shape, user line), each
node filled with the colour of the kernel it was fused into, laid out by
graphviz `dot -Tsvg`.

We call the `dot` program directly rather than importing the `graphviz`
package: it is one subprocess either way, and the package is an optional
test dependency. Where `dot` is missing, `draw_graph` says so in plain words
and the HTML page shows that message instead of the picture.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

from fuselens import present
from fuselens.events import CompiledGraph, GraphNode, Report
from fuselens.report import common

# Beyond this many nodes dot takes minutes and the picture is unreadable.
MAX_NODES = 400
DOT_TIMEOUT_S = 30.0
_RECORD_SPECIAL = re.compile(r'([{}|<>"\\])')
_DOT_ID_SPECIAL = re.compile(r'(["\\])')


@dataclass
class GraphPicture:
    """`svg` is an inline-ready <svg> element, or None with `message` saying
    why there is no picture (graphviz missing, too big, dot failed)."""

    svg: Optional[str]
    message: str = ""


def dot_path() -> Optional[str]:
    """Path of graphviz's `dot`, or None where graphviz is not installed."""
    return shutil.which("dot")


def record_escape(text: str) -> str:
    """Text safe inside a DOT record label (field separators escaped)."""
    return _RECORD_SPECIAL.sub(r"\\\1", text.replace("\n", " "))


def _dot_string(text: str) -> str:
    return '"' + _DOT_ID_SPECIAL.sub(r"\\\1", text.replace("\n", " ")) + '"'


def node_fill(node: GraphNode, colors: dict[str, str]) -> str:
    """The kernel's colour; inputs/outputs grey; unfused compute white."""
    if node.kernel and node.kernel in colors:
        return colors[node.kernel]
    if node.op in ("placeholder", "output", "get_attr"):
        return common.IO_FILL
    return common.UNFUSED_FILL


def node_label(node: GraphNode, root: Optional[str] = None) -> str:
    """FxGraphDrawer-like record: {name|op target|shape|kernel|file:line}.
    Already escaped for DOT: goes between double quotes as it is."""
    # A placeholder's target is its own (mangled) name again: say it once.
    plain_io = node.op in ("placeholder", "output")
    fields = [record_escape(node.name), record_escape(node.op if plain_io else f"{node.op}: {node.target}")]
    if node.shape:
        fields.append(record_escape(node.shape))
    if node.kernel:
        fields.append(record_escape(f"kernel: {node.kernel}"))
    if node.location is not None:
        fields.append(record_escape(present.location_label(node.location, root)))
    return "{" + "|".join(f + "\\l" for f in fields) + "}"


def graph_dot(report: Report, graph: CompiledGraph, root: Optional[str] = None, prefix: str = "g") -> str:
    """DOT source for one compiled graph; `prefix` keeps element ids unique
    when several pictures share one HTML page."""
    colors = common.kernel_colors(report, graph)
    kernel_index = {name: i for i, name in enumerate(colors)}
    lines = [
        f"digraph {_dot_string(prefix)} {{",
        f'  graph [id={_dot_string(prefix)}, rankdir=TB, bgcolor="transparent", nodesep=0.25, ranksep=0.35];',
        '  node [shape=record, style="rounded,filled", fontname="Helvetica", fontsize=10, color="#555555", '
        'penwidth=1];',
        '  edge [color="#777777", arrowsize=0.6];',
    ]
    known = {n.name for n in graph.nodes}
    for i, n in enumerate(graph.nodes):
        css = "fl-node" + (f" fl-k{kernel_index[n.kernel]}" if n.kernel in kernel_index else "")
        lines.append(
            f"  {_dot_string(n.name)} [id={_dot_string(f'{prefix}-n{i}')}, class={_dot_string(css)}, "
            f"fillcolor={_dot_string(node_fill(n, colors))}, label=\"{node_label(n, root)}\"];"
        )
    for j, n in enumerate(graph.nodes):
        for k, src in enumerate(dict.fromkeys(n.inputs)):
            if src in known:
                lines.append(f"  {_dot_string(src)} -> {_dot_string(n.name)} [id={_dot_string(f'{prefix}-e{j}-{k}')}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_graph(report: Report, graph: CompiledGraph, root: Optional[str] = None, prefix: str = "g") -> GraphPicture:
    """Lay the graph out with graphviz; never raises for a missing or
    failing `dot`, the message says what happened."""
    if not graph.nodes:
        return GraphPicture(None, "This graph was recorded without its nodes, so there is nothing to draw.")
    if len(graph.nodes) > MAX_NODES:
        return GraphPicture(None, f"This graph has {len(graph.nodes)} nodes; pictures are drawn up to {MAX_NODES}.")
    dot = dot_path()
    if dot is None:
        return GraphPicture(
            None,
            "Graph picture not drawn: graphviz is not installed (no `dot` program on PATH). "
            "Install it (e.g. `apt-get install graphviz` or `brew install graphviz`) and run the report again.",
        )
    try:
        proc = subprocess.run(
            [dot, "-Tsvg"], input=graph_dot(report, graph, root, prefix).encode(), capture_output=True,
            timeout=DOT_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        return GraphPicture(None, f"Graph picture not drawn: graphviz took longer than {DOT_TIMEOUT_S:.0f} s.")
    except OSError as exc:
        return GraphPicture(None, f"Graph picture not drawn: could not run graphviz ({exc}).")
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        return GraphPicture(None, f"Graph picture not drawn: graphviz failed ({err[0] if err else proc.returncode}).")
    return GraphPicture(inline_svg(proc.stdout.decode("utf-8", errors="replace")))


def inline_svg(svg: str) -> str:
    """dot's SVG document -> an <svg> element for inlining in HTML: no XML
    prolog, no DOCTYPE (it names an external DTD), no comments."""
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    return re.sub(r"<!--.*?-->\n?", "", svg, flags=re.S).strip()
