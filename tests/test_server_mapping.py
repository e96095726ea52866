"""The language server's pure parts, without a server: settings, project
config, position encodings, notebook cell maps, Report -> diagnostics, and
each quick-fix edit applied and re-parsed."""

from __future__ import annotations

import ast
import asyncio

import pytest
from pygls.workspace import PositionCodec

from fuselens.events import (
    CompiledGraph,
    ErrorEntry,
    FusionDecision,
    GraphBreak,
    GraphNode,
    Kernel,
    Recompile,
    Report,
    RunInfo,
    ShapeChange,
    SourceLocation,
)
from fuselens.server.analysis import AnalysisManager, RunPlan
from fuselens.server.diagnostics import kernel_ops, report_findings
from fuselens.server.fixes import apply_edits, fixes_for
from fuselens.server.insights import compiled_functions, hover
from fuselens.server.program import ProgramText, notebook_program
from fuselens.server.project import load_config
from fuselens.server.resolve import Resolver
from fuselens.server.settings import Settings


def test_settings_accept_flat_nested_and_dotted_forms_and_ignore_bad_values():
    s = Settings().merged({"trusted": True, "runOn": "open"})
    assert s.trusted and s.run_on == "open"
    s = Settings().merged({"fuselens": {"inlayHints": True, "timeout": 5}})
    assert s.inlay_hints and s.timeout_s == 5.0
    s = Settings().merged({"fuselens.maxCalls": 3, "fuselens.runOn": "sometimes", "trusted": "yes"})
    assert s.max_calls == 3 and s.run_on == "save" and s.trusted is False


def test_pyproject_tool_fuselens_entry_backend_timeout_max_calls(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.fuselens]\nentry = "train.py --steps 2"\nbackend = "eager"\ntimeout = 30\nmax_calls = 4\n'
    )
    config = load_config(str(tmp_path / "pyproject.toml"))
    assert config.entry == ["train.py", "--steps", "2"]
    assert (config.backend, config.timeout_s, config.max_calls) == ("eager", 30.0, 4)
    (tmp_path / "pyproject.toml").write_text('[tool.fuselens]\ntimeout = "soon"\n')
    assert load_config(str(tmp_path / "pyproject.toml")).problems == ["timeout must be a positive number of seconds"]


@pytest.mark.parametrize("encoding,expected", [("utf-16", 5), ("utf-8", 8), ("utf-32", 4)])
def test_columns_are_converted_to_the_negotiated_encoding(tmp_path, encoding, expected):
    line = "é😀ab"  # é is 2 UTF-8 bytes, 😀 is 4 bytes and 2 UTF-16 units
    program = ProgramText.for_script(str(tmp_path / "prog.py"), "file:///prog.py", line + "\n")
    resolver = Resolver(program, [str(tmp_path)], PositionCodec(encoding))
    assert resolver.line_end("file:///prog.py", 0).character == expected
    assert resolver.line_range("file:///prog.py", 0).end.character == expected


def test_notebook_cells_join_in_order_and_map_back_to_cell_relative_lines():
    program = notebook_program("file:///nb.ipynb", [("cell:0", "import torch\nx = 1\n"), ("cell:2", "%time y = 2\nprint(x)")])
    assert program.text == "import torch\nx = 1\npass\nprint(x)\n"
    assert program.to_document(3) == ("cell:2", 1)
    assert program.to_program("cell:2", 0) == 2
    assert notebook_program("nb", [("c", "%%bash\necho hi\n")]).text == "\n\n"


def _report(path: str) -> Report:
    def loc(line, fn="f"):
        return SourceLocation(file=path, line=line, function=fn)

    return Report(
        run=RunInfo(target=path),
        graph_breaks=[GraphBreak(loc(6), "Unsupported Tensor.item() call with capture_scalar_outputs=False",
                                 hints=["Set `torch._dynamo.config.capture_scalar_outputs = True` "],
                                 registry_id="GB0124", user_stack=[loc(10, "<module>"), loc(6)])],
        recompiles=[Recompile("f", loc(4), "0/1", reasons=["tensor 'x' size mismatch at dim 0: 4 -> 8"],
                              shape_changes=[ShapeChange("x", 0, "4", "8")])],
        graphs=[CompiledGraph("0/0", "f", loc(4), "fuselens", nodes=[GraphNode("add", "call_function", "aten.add", location=loc(5))])],
        kernels=[Kernel("cpp_fused_add_mul_0", "cpp", graph_id="0/0:dynamo", ops=["aten.add.Tensor", "aten.mul.Tensor"],
                        source_lines=[loc(5), loc(6)], calls=2, total_time_us=3.0)],
        fusion=[FusionDecision("not_fused", ["mul", "sum"], "reduction over a different iteration space",
                               rule="iteration-space", locations=[loc(6), loc(7)], option="torch._inductor.config.aggressive_fusion = True")],
        errors=[ErrorEntry("exception", "ValueError: boom", loc(11, "<module>"))],
    )


SOURCE = """import torch


@torch.compile(backend="fuselens")
def f(x):
    y = x.sum().item() + x
    return (y * 2).sum()


a = torch.randn(4)
f(a)
raise ValueError("boom")
"""


def _resolver(tmp_path, encoding="utf-16"):
    path = str(tmp_path / "prog.py")
    program = ProgramText.for_script(path, "file:///prog.py", SOURCE)
    return Resolver(program, [str(tmp_path)], PositionCodec(encoding)), path


def test_report_maps_to_diagnostics_with_stable_codes_related_stack_and_severities(tmp_path):
    resolver, path = _resolver(tmp_path)
    (uri, findings), = report_findings(_report(path), resolver).items()
    codes = {(f.code, f.line) for f in findings}
    assert codes == {("recompile", 3), ("graph-break", 5), ("fused", 4), ("fused", 5), ("fusion-blocked", 5), ("error", 10)}
    gb = next(f.diagnostic for f in findings if f.code == "graph-break")
    assert gb.source == "fuselens" and [r.location.range.start.line for r in gb.related_information] == [9, 5]
    assert gb.range.start.character == 4 and gb.range.end.character == len("    y = x.sum().item() + x")
    fused = next(f.diagnostic for f in findings if f.code == "fused")
    assert "cpp_fused_add_mul_0" in fused.message and "add, mul" in fused.message and fused.severity == 4


def test_each_fix_for_the_report_applies_and_parses(tmp_path):
    resolver, path = _resolver(tmp_path)
    findings = report_findings(_report(path), resolver)["file:///prog.py"]
    titles = []
    for finding in findings:
        for fix in fixes_for(SOURCE, finding.event, finding.line):
            ast.parse(apply_edits(SOURCE, fix.edits))
            titles.append(fix.title)
    assert sorted(titles) == sorted([
        "Mark a dynamic (dim 0) before the call on line 11: torch._dynamo.mark_dynamic",
        "Compile f with dynamic=True",
        "Set torch._dynamo.config.capture_scalar_outputs = True",
        "Set torch._inductor.config.aggressive_fusion = True",
    ])


def test_fix_that_would_not_parse_is_never_offered():
    source = "import torch\nf = torch.compile(lambda x: x)\n"
    # the compiled callable is a lambda: no def, no call site, and `dynamic=True`
    # is the only candidate; a print removal on a non-print line yields nothing
    fixes = fixes_for(source, GraphBreak(SourceLocation("prog.py", 2), reason="print"), 1)
    assert fixes == []
    recompile = Recompile("f", SourceLocation("prog.py", 1), "0/1", shape_changes=[ShapeChange("x", 0, "2", "3")])
    assert fixes_for("def broken(:\n", recompile, 0) == []


def test_a_recompile_whose_catalogue_fixes_leave_out_dynamic_true_gets_no_dynamic_true_quick_fix():
    """A bool flag (transformers' cache layers' is_initialized) stays constant under
    dynamic=True: offered, the quick-fix changed nothing."""
    from fuselens import fixcatalog

    source = "import torch\n@torch.compile\ndef f(x, flag):\n    return x + 1 if flag else x\nf(torch.ones(2), True)\n"
    fixes = fixcatalog.recompile_fixes("value", "flag", None, value="True")
    recompile = Recompile("f", SourceLocation("prog.py", 3), "0/1", fixes=fixes)
    assert not [f for f in fixes_for(source, recompile, 2) if "dynamic=True" in f.title]
    sized = Recompile("f", SourceLocation("prog.py", 3), "0/1", fixes=fixcatalog.recompile_fixes("size", "x", 0))
    assert [f for f in fixes_for(source, sized, 2) if "dynamic=True" in f.title]


def test_a_backend_failure_diagnostic_says_the_cause_and_its_verified_fix_not_torchs_hint(tmp_path):
    from fuselens.events import FixAdvice

    resolver, path = _resolver(tmp_path)
    fix = FixAdvice("custom-op-backward", 'compile with backend="fuselens"', edit="backend", args=["fuselens"],
                    verified=True, preferred=True)
    gb = GraphBreak(SourceLocation(path, 11, "<module>"), reason="the inductor compiler failed with "
                    "aten._local_scalar_dense.default", hints=["Report an issue to the backend compiler repo."],
                    explained="the inductor compiler could not trace the backward of a custom op", fixes=[fix])
    (finding,) = report_findings(Report(run=RunInfo(target=path), graph_breaks=[gb]), resolver)["file:///prog.py"]
    message = finding.diagnostic.message
    assert "could not trace the backward of a custom op" in message
    assert 'Fix: compile with backend="fuselens" (verified)' in message
    assert "Report an issue" not in message
    source = SOURCE.replace('@torch.compile(backend="fuselens")', '@torch.compile(backend="inductor")')
    (quick,) = [q for q in fixes_for(source, gb, 10) if "backend" in q.title]
    assert quick.preferred and '@torch.compile(backend="fuselens")' in apply_edits(source, quick.edits)


def test_inductor_kernel_ops_are_read_from_its_name():
    assert kernel_ops(Kernel("triton_poi_fused_add_cos_mul_sin_0", "triton", backend="inductor")) == ["add", "cos", "mul", "sin"]


def test_hover_names_graph_kernels_and_time_inside_the_compiled_function(tmp_path):
    resolver, path = _resolver(tmp_path)
    report = _report(path)
    functions = compiled_functions(report, resolver)
    assert [(f.name, f.line, f.end_line, f.breaks, f.recompiles) for f in functions] == [("f", 3, 6, 1, 1)]
    text = hover(report, resolver, functions, "file:///prog.py", 4).contents.value
    assert "cpp_fused_add_mul_0" in text and "3.0 µs" in text and "0/0:dynamo" in text
    assert hover(report, resolver, functions, "file:///prog.py", 0) is None


async def test_result_of_a_superseded_run_is_dropped_even_if_the_run_ignores_cancel(tmp_path):
    release = asyncio.Event()

    async def stubborn_runner(plan, on_event):
        if plan.contents == "v1":
            await asyncio.shield(release.wait())  # a worker that answers despite the cancel
        return Report(run=RunInfo(target=plan.contents))

    delivered = []
    manager = AnalysisManager(runner=stubborn_runner)

    def plan(contents):
        return RunPlan("u", "script", "p.py", [], str(tmp_path), {}, ProgramText("p.py", ""), [], "", "p", contents=contents)

    first = manager.submit(plan("v1"), lambda p, r, c: delivered.append(r.run.target))
    await asyncio.sleep(0.01)
    second = manager.submit(plan("v2"), lambda p, r, c: delivered.append(r.run.target))
    await second
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert delivered == ["v2"]
    manager.submit(plan("v2"), lambda p, r, c: delivered.append(("cached", r.run.target)))
    assert delivered[-1] == ("cached", "v2")


async def test_requests_within_the_debounce_run_once_with_the_last_contents_and_a_later_one_runs_again(tmp_path):
    ran, delivered = [], []

    async def runner(plan, on_event):
        ran.append(plan.contents)
        return Report(run=RunInfo(target=plan.contents))

    manager = AnalysisManager(runner=runner, debounce_s=0.2)

    def plan(contents):
        return RunPlan("u", "script", "p.py", [], str(tmp_path), {}, ProgramText("p.py", ""), [], "", "p", contents=contents)

    tasks = [manager.submit(plan(f"v{i}"), lambda p, r, c: delivered.append(r.run.target)) for i in range(20)]
    await asyncio.gather(*tasks, return_exceptions=True)
    assert ran == ["v19"] and delivered == ["v19"]
    await manager.submit(plan("v20"), lambda p, r, c: delivered.append(r.run.target))
    assert ran == ["v19", "v20"] and delivered == ["v19", "v20"]
