"""The report lists exactly the graph breaks and recompiles torch reports,
at the right user lines.

Each corpus program runs once under capture (in worker subprocesses, in
parallel) and once in this process under torch's own bookkeeping:
`torch._dynamo.utils.counters["graph_break"]` and `["unimplemented"]` (how many breaks),
`get_compilation_metrics()` (which compiles were recompiles, which hit the
recompile limit) and `torch._dynamo.explain` (the user frame of each break).
All with backend="eager" (an Inductor compile costs ~15 s here).
"""

from __future__ import annotations

import concurrent.futures
import os
import runpy
import sys

import pytest

from fuselens.capture import RunOptions, Target, analyze
from fuselens.notebook_program import load_cells

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")


def p(name: str) -> str:
    return os.path.join(CORPUS, name)


# program -> the (file, line) of each graph break, as a user would point at it
EXPECTED_BREAKS = {
    "gb_print.py": {(p("gb_print.py"), 6)},
    "gb_item.py": {(p("gb_item.py"), 5)},
    "gb_tolist.py": {(p("gb_tolist.py"), 6)},
    "gb_data_dependent_if.py": {(p("gb_data_dependent_if.py"), 6)},
    "gb_unsupported_call.py": {(p("gb_unsupported_call.py"), 8)},
    "gb_nested_modules.py": {(p("gb_nested_modules.py"), 12)},
    "gb_in_helper.py": {(p("helpers/ops.py"), 6)},
    "rc_shape.py": set(),
    "rc_dtype.py": set(),
    "rc_value_guard.py": set(),
    "rc_limit.py": set(),
    "clean_model.py": set(),
}
PROGRAMS = sorted(EXPECTED_BREAKS) + ["notebook.ipynb"]


@pytest.fixture(scope="module")
def reports():
    """One capture run per corpus program (3 workers at a time)."""

    def one(name):
        return name, analyze(Target.from_cli([name], cwd=CORPUS), RunOptions(timeout_s=120))

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        return dict(pool.map(one, PROGRAMS))


def _reset_torch():
    import torch
    from torch._dynamo.utils import clear_compilation_metrics, counters

    torch._dynamo.reset()
    counters.clear()
    clear_compilation_metrics()


def _torch_view(run):
    """Run `run()` in-process; return torch's own counts and metrics."""
    import torch
    from torch._dynamo.utils import counters, get_compilation_metrics

    saved = torch._dynamo.config.save_config()
    _reset_torch()
    try:
        run()
        metrics = list(get_compilation_metrics())
        # 2.13 files data-dependent branching under "unimplemented" (beside
        # the recompile limit, which is no graph break), the others under
        # "graph_break".
        unimplemented = sum(n for k, n in counters["unimplemented"].items() if "recompile" not in k.lower())
        breaks = sum(counters["graph_break"].values()) + unimplemented
        return breaks, metrics
    finally:
        torch._dynamo.config.load_config(saved)
        _reset_torch()


def _run_script(name):
    def run():
        sys.path.insert(0, CORPUS)
        try:
            runpy.run_path(p(name), run_name="__main__")
        finally:
            sys.path.remove(CORPUS)
            sys.modules.pop("helpers.ops", None)
            sys.modules.pop("helpers", None)

    return run


def _explain_breaks(name):
    """(file, line) of the innermost user frame of each break explain() sees
    for the program's `fn` on the same input as its first call."""
    import torch

    sys.path.insert(0, CORPUS)
    try:
        ns = runpy.run_path(p(name), run_name="corpus")
    finally:
        sys.path.remove(CORPUS)
    args = {
        "gb_nested_modules.py": (torch.randn(3, 8),),
        "gb_in_helper.py": (torch.randn(4),),
    }.get(name, (torch.randn(6),))
    _reset_torch()
    out = torch._dynamo.explain(ns["fn"])(*args)
    _reset_torch()
    return {(r.user_stack[-1].filename, r.user_stack[-1].lineno) for r in out.break_reasons}


def _recompile_ids(metrics):
    """Compile ids of torch's recompiles: every compile of a frame after its first."""
    return {m.compile_id for m in metrics if m.compile_id and not m.compile_id.endswith("/0")}


@pytest.mark.parametrize("name", sorted(EXPECTED_BREAKS))
def test_graph_breaks_match_torch_counters_at_exact_user_lines(reports, name):
    report = reports[name]
    assert not [e for e in report.errors if e.kind != "compile"], report.errors
    breaks, metrics = _torch_view(_run_script(name))
    assert sum(g.count for g in report.graph_breaks) == breaks
    where = {(g.location.file, g.location.line) for g in report.graph_breaks}
    assert where == EXPECTED_BREAKS[name]
    if name.startswith("gb_"):
        assert where == {(os.path.realpath(f), line) for f, line in _explain_breaks(name)}
    for gb in report.graph_breaks:
        assert "site-packages" not in gb.location.file and not gb.location.function.startswith("torch_dynamo_resume")
        assert gb.registry_id.startswith("GB") and gb.reason and gb.explanation


@pytest.mark.parametrize("name", sorted(EXPECTED_BREAKS))
def test_recompiles_match_torch_compilation_metrics(reports, name):
    report = reports[name]
    _, metrics = _torch_view(_run_script(name))
    assert {r.compile_id for r in report.recompiles} == _recompile_ids(metrics)
    limited = {m.compile_id for m in metrics if m.fail_reason and "recompile_limit" in str(m.fail_reason)}
    assert {r.compile_id for r in report.recompiles if r.hit_limit} == limited
    for rc in report.recompiles:
        assert not rc.function.startswith("torch_dynamo_resume") and rc.location.line > 0


def test_shape_recompile_names_input_dim_sizes_and_offers_mark_dynamic(reports):
    (rc,) = reports["rc_shape.py"].recompiles
    assert (rc.function, rc.location.file, rc.location.line) == ("fn", p("rc_shape.py"), 4)
    assert rc.reasons == ["tensor 'x' size mismatch at dim 0: 4 -> 7"]
    change = rc.shape_changes[0]
    assert (change.input_name, change.dim, change.old, change.new, change.became_dynamic) == ("x", 0, "4", "7", True)
    assert "torch._dynamo.mark_dynamic(x, 0)" in rc.fix
    assert [f.edit for f in rc.fixes] == ["mark_dynamic", "dynamic_true"]  # the catalogue's, best first


def test_recompile_names_the_user_call_site_that_triggered_it(reports):
    (rc,) = reports["rc_shape.py"].recompiles
    assert rc.call_site is not None
    assert (rc.call_site.file, rc.call_site.line, rc.call_site.code) == (p("rc_shape.py"), 11, "f(torch.randn(7, 3))")
    (nb,) = reports["notebook.ipynb"].recompiles
    assert nb.call_site is not None
    assert (nb.call_site.file, nb.call_site.cell, nb.call_site.line) == (p("notebook.ipynb"), 2, 6)


def test_dtype_recompile_lists_the_dtype_change(reports):
    (rc,) = reports["rc_dtype.py"].recompiles
    assert rc.dtype_changes == ["x: float32 -> float64"]
    assert rc.reasons == ["tensor 'x' dtype changed: float32 -> float64"]


def test_value_guard_recompile_names_the_int_argument_and_its_line(reports):
    rcs = reports["rc_value_guard.py"].recompiles
    assert len(rcs) == 1  # the second change finds n already dynamic
    (change,) = rcs[0].shape_changes
    assert (change.input_name, change.dim, change.old, change.new) == ("n", None, "2", "3")
    assert f"(guarded at {p('rc_value_guard.py')}:5)" in rcs[0].reasons[0]


def test_recompile_limit_is_flagged_with_its_function(reports):
    limited = [r for r in reports["rc_limit.py"].recompiles if r.hit_limit]
    assert len(limited) == 1 and limited[0].function == "fn" and limited[0].location.line == 7
    assert "recompile_limit" in limited[0].fix


def test_clean_model_has_no_findings_and_one_graph_with_its_ops(reports):
    report = reports["clean_model.py"]
    assert not report.graph_breaks and not report.recompiles and not report.errors
    (graph,) = report.graphs
    assert graph.backend == "eager" and graph.stage == "dynamo"
    assert any("layer_norm" in op for op in graph.ops) and any("gelu" in op for op in graph.ops)
    located = {n.location.line for n in graph.nodes if n.location}
    assert 12 in located  # `return x + gelu(fc(norm(x)))` in Block.forward


def test_graph_of_a_broken_function_is_located_in_the_user_function(reports):
    graphs = reports["gb_print.py"].graphs
    assert graphs and all(g.location.file == p("gb_print.py") and g.function == "fn" for g in graphs)


def test_notebook_findings_point_at_cell_and_cell_relative_line(reports):
    report = reports["notebook.ipynb"]
    assert report.run.exit_code == 0 and not report.errors

    def run():
        ns: dict = {"__name__": "__main__"}
        for cell in load_cells(p("notebook.ipynb")):
            exec(compile(cell.source, cell.filename, "exec"), ns)

    breaks, metrics = _torch_view(run)
    assert sum(g.count for g in report.graph_breaks) == breaks == 1
    (gb,) = report.graph_breaks
    assert (gb.location.file, gb.location.cell, gb.location.line) == (p("notebook.ipynb"), 0, 6)
    assert gb.location.code == "print('in cell')"
    assert {r.compile_id for r in report.recompiles} == _recompile_ids(metrics)
    (rc,) = report.recompiles
    assert (rc.function, rc.location.cell, rc.location.line) == ("g", 2, 1)
