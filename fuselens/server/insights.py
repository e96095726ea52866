"""Hover, code lens and inlay hints from a report. Pure functions."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

from lsprotocol import types

from fuselens import present
from fuselens.events import CompiledGraph, Kernel, Report
from fuselens.server.diagnostics import kernel_lines, kernel_ops, node_locations
from fuselens.server.resolve import Resolver
from fuselens.server.source_index import SourceIndex

SHOW_REPORT = "fuselens.showReport"
SHOW_KERNEL_SOURCE = "fuselens.showKernelSource"


@dataclass
class CompiledFunction:
    """One compiled function as the editor shows it."""

    name: str
    uri: str
    line: int  # 0-based line of its def (or first decorator)
    end_line: int  # 0-based last line; == line when unknown
    compile_ids: list[str] = field(default_factory=list)
    graphs: list[CompiledGraph] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    breaks: int = 0
    recompiles: int = 0

    @property
    def kernel_time_us(self) -> float:
        return sum(k.total_time_us for k in self.kernels)

    def contains(self, uri: str, line: int) -> bool:
        return uri == self.uri and self.line <= line <= self.end_line


def compiled_functions(report: Report, resolver: Resolver) -> list[CompiledFunction]:
    """Compiled functions of the report that lie in the editor's documents.
    Graphs of resume functions (after a graph break) count for the function
    they resume."""
    index = SourceIndex(resolver.program.text) if resolver.program.text else None
    found: dict[tuple[str, int], CompiledFunction] = {}
    for graph in report.graphs:
        where = resolver.locate(graph.location)
        if where is None:
            continue
        start, end = _function_span(index, resolver, where[0], where[1], graph.function)
        fn = found.get((where[0], start))
        if fn is None:
            fn = found[(where[0], start)] = CompiledFunction(graph.function, where[0], start, end)
        fn.graphs.append(graph)
        if graph.compile_id not in fn.compile_ids:
            fn.compile_ids.append(graph.compile_id)
    for fn in found.values():
        ids = {g.graph_id or f"{g.compile_id}:{g.stage}" for g in fn.graphs}
        fn.kernels = [k for k in report.kernels if k.graph_id in ids or k.graph_id.split(":")[0] in fn.compile_ids]
        fn.recompiles = sum(1 for r in report.recompiles if r.function == fn.name)
        for gb in report.graph_breaks:
            where = resolver.locate(gb.location)
            if (where and fn.contains(*where)) or (where is None and gb.location.function == fn.name):
                fn.breaks += gb.count
    return sorted(found.values(), key=lambda f: (f.uri, f.line))


def _function_span(index: Optional[SourceIndex], resolver: Resolver, uri: str, line: int, name: str) -> tuple[int, int]:
    """(first, last) document line of the function `name` that holds `line`
    (first = its first decorator); (line, line) when unknown."""
    program_line = resolver.program.to_program(uri, line)
    if index is None or index.tree is None or program_line is None:
        return line, line
    best = None
    for node in ast.walk(index.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            if first <= program_line <= node.end_lineno - 1 and (best is None or first > best[0]):
                if node.name == name or best is None:
                    best = (first, node.end_lineno - 1)
    if best is None:
        return line, line
    return line + (best[0] - program_line), line + (best[1] - program_line)


def code_lenses(functions: list[CompiledFunction], uri: str, resolver: Resolver) -> list[types.CodeLens]:
    out = []
    for fn in functions:
        if fn.uri != uri:
            continue
        rng = resolver.line_range(uri, fn.line)
        title = (
            f"fuselens: {len(fn.compile_ids)} graph{'s' * (len(fn.compile_ids) != 1)} · "
            f"{fn.breaks} break{'s' * (fn.breaks != 1)} · {fn.recompiles} recompile{'s' * (fn.recompiles != 1)} · "
            f"{len(fn.kernels)} kernel{'s' * (len(fn.kernels) != 1)}"
        )
        if fn.kernel_time_us:
            title += f" · {present.duration_us(fn.kernel_time_us)}"
        out.append(types.CodeLens(range=rng, command=types.Command(title=title, command=SHOW_REPORT, arguments=[uri, fn.name, fn.line])))
        generated = [k for k in fn.kernels if k.source]
        if generated:
            out.append(
                types.CodeLens(
                    range=rng,
                    command=types.Command(
                        title=f"generated source ({len(generated)})",
                        command=SHOW_KERNEL_SOURCE,
                        arguments=[uri, generated[0].name, [k.name for k in generated]],
                    ),
                )
            )
    return out


def hover(report: Report, resolver: Resolver, functions: list[CompiledFunction], uri: str, line: int) -> Optional[types.Hover]:
    """Markdown about one line inside a compiled region, None outside."""
    kernels = kernel_lines(report, resolver).get((uri, line), [])
    nodes = node_locations(report)
    graphs = []
    for (gid, _name), loc in nodes.items():
        if resolver.locate(loc) == (uri, line) and gid not in graphs:
            graphs.append(gid)
    enclosing = [f for f in functions if f.contains(uri, line)]
    if not (kernels or graphs or enclosing):
        return None
    parts = []
    for fn in enclosing:
        parts.append(
            f"**fuselens** · compiled `{fn.name}`: {len(fn.compile_ids)} graph(s) "
            f"({', '.join(fn.compile_ids)}), {fn.breaks} break(s), {fn.recompiles} recompile(s)"
        )
    if graphs:
        parts.append("Graphs with ops from this line: " + ", ".join(f"`{g}`" for g in graphs))
    for k in kernels:
        timing = f", {k.calls} calls, {present.duration_us(k.total_time_us)}" if k.calls else ""
        parts.append(f"Kernel `{k.name}` ({k.kind}): {', '.join(kernel_ops(k)) or 'ops unknown'}{timing}")
    if not kernels and enclosing:
        parts.append("No generated kernel recorded for this line.")
    return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value="\n\n".join(parts)))


def inlay_hints(report: Report, resolver: Resolver, uri: str, first: int, last: int) -> list[types.InlayHint]:
    """Kernel names at the end of lines [first, last]."""
    out = []
    for (k_uri, line), kernels in sorted(kernel_lines(report, resolver).items()):
        if k_uri != uri or not first <= line <= last:
            continue
        names = ", ".join(k.name for k in kernels[:3]) + (" …" if len(kernels) > 3 else "")
        out.append(
            types.InlayHint(
                position=resolver.line_end(uri, line),
                label=f"⟶ {names}",
                padding_left=True,
                tooltip=f"fuselens: ops of this line run in {len(kernels)} kernel(s)",
            )
        )
    return out
