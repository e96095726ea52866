"""Pure parts of capture (no worker, no torch): target parsing, notebook
cells, the trace-text readers, report assembly."""

from __future__ import annotations

import json
import os

import pytest

from fuselens.capture import RunOptions, Target, TargetError, assemble
from fuselens.notebook_program import neutralize_ipython, split_cell_filename
from fuselens.capture.tracetext import parse_graph_break, split_recompile_payload, translate_guard
from fuselens.events import GraphBreak, Kernel, KernelTiming, PhaseTime, Recompile, RunInfo, SourceLocation
from fuselens.serialize import from_data, to_data

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")


def test_script_target_keeps_program_arguments_after_double_dash():
    t = Target.from_cli(["gb_print.py", "--", "--epochs", "1"], cwd=CORPUS)
    assert (t.kind, t.value, t.args) == ("script", os.path.join(CORPUS, "gb_print.py"), ["--epochs", "1"])


def test_module_target_accepts_dash_m_and_arguments():
    t = Target.from_cli(["-m", "corpus_pkg.run", "--", "a"], cwd=CORPUS)
    assert (t.kind, t.value, t.args, t.label()) == ("module", "corpus_pkg.run", ["a"], "-m corpus_pkg.run")


def test_notebook_target_is_recognised_by_extension():
    assert Target.from_cli(["notebook.ipynb"], cwd=CORPUS).kind == "notebook"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["missing.py"], "no such file"),
        (["not_python.txt"], "not a Python script"),
        (["-m"], "-m needs a module name"),
        (["-m", "not a module"], "-m needs a module name"),
        (["--frobnicate"], "unknown option"),
        ([], "no target"),
        (["helpers"], "is a directory"),
    ],
)
def test_unusable_targets_raise_a_one_line_target_error(argv, message):
    with pytest.raises(TargetError) as info:
        Target.from_cli(argv, cwd=CORPUS)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_broken_notebook_json_is_a_target_error(tmp_path):
    (tmp_path / "bad.ipynb").write_text("{not json")
    with pytest.raises(TargetError, match="not a readable notebook"):
        Target.from_cli(["bad.ipynb"], cwd=str(tmp_path))


def test_run_options_round_trip_through_dict():
    opts = RunOptions(backend="eager", timeout_s=3.0, max_calls=2, compiler_options={"fusion": False})
    assert from_data(RunOptions, json.loads(json.dumps(to_data(opts)))) == opts


def test_ipython_magics_become_pass_keeping_line_numbers():
    src = "import torch\n%matplotlib inline\nfor i in range(2):\n    !ls\nfiles = !ls\nx = 1"
    out = neutralize_ipython(src).split("\n")
    assert out == ["import torch", "pass", "for i in range(2):", "    pass", "files = []", "x = 1"]
    compile("\n".join(out), "cell", "exec")


def test_non_python_cell_magic_makes_the_cell_inert():
    assert neutralize_ipython("%%bash\necho hi\nls").strip() == ""
    assert neutralize_ipython("%%time\nx = 1").split("\n") == ["", "x = 1"]


def test_cell_filenames_map_back_to_notebook_and_cell():
    assert split_cell_filename("/a/b.ipynb#cell12") == ("/a/b.ipynb", 12)
    assert split_cell_filename("/a/b.py") is None


GB_TEXT = """Graph break in user code at /p/model.py:12
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):

Failed to trace builtin operator
  Explanation: Dynamo does not know how to trace builtin operator `print`
  Hint: Avoid calling builtin `print`.
  Hint: Or add it to `torch._dynamo.config.reorderable_logging_functions`.

  Developer debug context: builtin print

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0059.html

User code traceback:
  File "/usr/lib/python3.11/runpy.py", line 88, in _run_code
  File "/p/model.py", line 30, in <module>
    f(x)
  File "/p/model.py", line 12, in forward
    print("hi")

Traceback (most recent call last):
  File "/x/torch/_dynamo/symbolic_convert.py", line 1076, in wrapper
"""


def test_graph_break_artifact_yields_reason_hints_registry_id_and_user_frames():
    gb = parse_graph_break(GB_TEXT)
    assert gb.reason == "Failed to trace builtin operator"
    assert gb.explanation.startswith("Dynamo does not know how to trace builtin operator")
    assert gb.hints == ["Avoid calling builtin `print`.", "Or add it to `torch._dynamo.config.reorderable_logging_functions`."]
    assert gb.registry_id == "GB0059"
    assert gb.at == ("/p/model.py", 12)
    assert gb.frames[-1] == ("/p/model.py", 12, "forward")
    assert all("symbolic_convert" not in f[0] for f in gb.frames)


def test_recompile_payload_is_raw_text_for_one_reason_and_json_for_several():
    assert split_recompile_payload("0/0: tensor 'x' size mismatch") == ["0/0: tensor 'x' size mismatch"]
    assert split_recompile_payload('[\n"0/1: a",\n"0/0: b"\n]') == ["0/1: a", "0/0: b"]


def test_size_guard_failure_reads_in_user_terms_with_input_dim_and_sizes():
    g = translate_guard("0/0: tensor 'x' size mismatch at index 0. expected 4, actual 7")
    assert g.text == "tensor 'x' size mismatch at dim 0: 4 -> 7"
    assert (g.input_name, g.dim, g.old, g.new) == ("x", 0, "4", "7")


def test_dtype_guard_failure_names_torch_dtypes():
    g = translate_guard("0/1: tensor 'x' dtype mismatch. expected Float, actual Double")
    assert g.text == "tensor 'x' dtype changed: float32 -> float64"


def test_value_guard_in_resume_function_points_at_the_user_line():
    raw = (
        "1/1: n == 2      # z = y * n  # mp/cap/prog.py:6 in torch_dynamo_resume_in_f_at_5\n"
        'User stack trace:\n  File "/tmp/cap/prog.py", line 6, in torch_dynamo_resume_in_f_at_5\n    z = y * n'
    )
    g = translate_guard(raw, "torch_dynamo_resume_in_f_at_5")
    assert g.kind == "value" and g.input_name == "n" and g.old == "2"
    assert g.guard_line == ("/tmp/cap/prog.py", 6, "f")
    assert "(guarded at /tmp/cap/prog.py:6)" in g.text


def test_stack_locals_of_resume_functions_are_named_for_the_user():
    g = translate_guard("1/0: tensor '___stack0' size mismatch at index 0. expected 4, actual 7", "torch_dynamo_resume_in_f_at_5")
    assert "___stack0" not in g.text and "graph break at line 5" in g.text


def _loc(line: int) -> SourceLocation:
    return SourceLocation("/p/m.py", line)


def test_assembly_merges_repeated_graph_breaks_and_applies_kernel_timings():
    events = [
        GraphBreak(_loc(3), "print", compile_id="0/0"),
        GraphBreak(_loc(3), "print", compile_id="0/1"),
        GraphBreak(_loc(4), "item", compile_id="0/0"),
        KernelTiming("k0", "0/0:dynamo", calls=2, total_time_us=5.0),  # before its kernel
        Kernel("k0", "cpp", graph_id="0/0:dynamo"),
        KernelTiming("k0", "0/0:dynamo", calls=1, total_time_us=2.5),
        PhaseTime("dynamo", 1.0, "0/0"),
        PhaseTime("backend", 0.5, "0/0"),
        PhaseTime("lowering", 0.2, "0/0"),
        Recompile("f", _loc(1), "0/1", reasons=["a"]),
        Recompile("f", _loc(1), "0/1", reasons=["a", "b"], hit_limit=True),
        RunInfo(target="", exit_code=0, torch_version="2.13"),
    ]
    report = assemble(events, RunInfo(target="m.py"), wall_s=2.0)
    assert [(g.location.line, g.count) for g in report.graph_breaks] == [(3, 2), (4, 1)]
    assert (report.kernels[0].calls, report.kernels[0].total_time_us) == (3, 7.5)
    assert report.timings.compile_s == 1.5 and report.timings.kernel_time_us == 7.5
    assert len(report.recompiles) == 1 and report.recompiles[0].reasons == ["a", "b"] and report.recompiles[0].hit_limit
    assert (report.run.target, report.run.exit_code, report.run.torch_version) == ("m.py", 0, "2.13")
