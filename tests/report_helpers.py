"""Shared by tests/test_report_*.py: the recorded demo report, and a copy of
it where every user-visible string field holds a unique token, so a test can
prove that a renderer shows each field (drop a field and its token is gone).
"""

from __future__ import annotations

import copy
import os

from fuselens.events import Report

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
DEMO_JSON = os.path.join(FIXTURES, "demo_report.json")


def demo_report() -> Report:
    with open(DEMO_JSON, encoding="utf-8") as f:
        return Report.from_json(f.read())


def tokened_report() -> tuple[Report, dict[str, str]]:
    """(report, {field description: token}). Tokens are letters and digits
    only, so no escaping (HTML, Markdown, JSON) can change them."""
    r = copy.deepcopy(demo_report())
    tokens: dict[str, str] = {}

    def tok(name: str) -> str:
        value = "tok" + "".join(ch for ch in name.title() if ch.isalnum()) + "Z"
        tokens[name] = value
        return value

    gb = r.graph_breaks[0]
    gb.reason = tok("graph break reason")
    gb.explanation = tok("graph break explanation")
    gb.hints = [tok("graph break hint one"), tok("graph break hint two")]
    gb.location.code = tok("graph break source line")
    gb.location.function = tok("graph break function")
    gb.count = 4242
    tokens["graph break count"] = "4242"
    gb.location.line = 1717
    tokens["graph break line"] = "1717"

    rc = r.recompiles[0]
    rc.reasons = [tok("recompile reason")]
    rc.raw_reasons = [tok("recompile raw reason")]
    rc.fix = tok("recompile fix")
    rc.shape_changes[0].input_name = tok("shape change input")
    rc.shape_changes[0].old = tok("shape change old")
    rc.shape_changes[0].new = tok("shape change new")
    r.recompiles[1].dtype_changes = [tok("dtype change")]
    r.recompiles[1].function = tok("recompiled function")

    g = r.graphs[1]
    g.function = tok("graph function")
    g.ops[0] = tok("graph op")
    g.backend = tok("graph backend")

    k = r.kernels[2]
    k.ops = [tok("kernel op")]
    k.source = tok("kernel source") + "\n" + k.source
    k.source_lines[0].line = 2323
    tokens["kernel user line"] = "2323"

    blocked = next(d for d in r.fusion if d.decision == "not_fused" and d.option)
    blocked.reason = tok("fusion reason")
    blocked.option = tok("fusion option")
    blocked.nodes = [tok("fusion node a"), tok("fusion node b")]

    err = r.errors[0]
    err.message = tok("error message")
    err.traceback = err.traceback + "\n" + tok("error traceback")

    r.timings.phases[0].phase = tok("phase name")
    r.run.torch_version = tok("torch version")
    return r, tokens


# Which tokens each renderer must show. Terminal omits kernel sources (too
# long for a terminal); SARIF carries findings only.
ALL = {
    "graph break reason", "graph break explanation", "graph break hint one", "graph break hint two",
    "graph break source line", "graph break function", "graph break count", "graph break line",
    "recompile reason", "recompile raw reason", "recompile fix", "shape change input", "shape change old",
    "shape change new", "dtype change", "recompiled function", "graph function", "graph op", "graph backend",
    "kernel op", "kernel source", "kernel user line", "fusion reason", "fusion option", "fusion node a",
    "fusion node b", "error message", "error traceback", "phase name", "torch version",
}
EXPECTED = {
    "terminal": ALL - {"kernel source"},
    "md": ALL,
    "html": ALL,
    "sarif": {
        "graph break reason", "graph break explanation", "graph break hint one", "graph break hint two",
        "graph break line", "recompile reason", "recompile fix", "shape change input", "shape change old",
        "shape change new", "dtype change", "recompiled function", "fusion reason", "fusion option",
        "fusion node a", "fusion node b", "error message", "torch version",
    },
}
