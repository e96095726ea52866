"""Reports a user can act on (issue 18): real programs from tests/corpus/real
run under capture (real workers, real torch, backend="eager" where the
program chooses it), checked for false errors, bounded values, verified
fixes, report length and the line of a hang or a crash."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from fuselens.capture import RunOptions, Target, analyze
from fuselens.capture import callsite, guardtext, tracetext
from fuselens.capture.assemble import assemble
from fuselens.capture.break_origin import break_origin
from fuselens.events import ORIGIN_OPTIMIZER_STEP, ErrorEntry, FixAdvice, GraphBreak, Report, RunInfo, SourceLocation
from fuselens import fixcatalog
from fuselens.report import common
from fuselens.report.cli import render
from fuselens.report import verify
from fuselens.report.verify import edited_source

REAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "real")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "fuselens", "report", *args], cwd=REAL, env=env,
                          capture_output=True, text=True, timeout=timeout)


# -- fast units ------------------------------------------------------------------
def test_bytes_guard_value_is_shown_as_type_size_and_short_prefix():
    raw = "0/0: header == " + repr(bytes(range(256)) * 8) + "  # print(len(header)) # f.py:8 in encode"
    short = guardtext.short_guard(raw)
    assert "bytes[2048]" in short and len(short) <= guardtext.MAX_TEXT


def test_each_recompile_keeps_only_the_latest_cache_entrys_failure():
    raws = ["0/2: x == 2", "0/1: x == 1", "0/0: x == 0"]
    assert guardtext.latest_entry(raws) == ["0/2: x == 2"]


def test_optimizer_step_breaks_are_by_design_with_no_fix_to_offer():
    """torch.optim breaks the graph around a step on purpose, also where the step is compiled
    alone as PyTorch's recipe does: "compile the step separately" was offered, and applied it
    removed nothing."""
    optim = os.path.join("site-packages", "torch", "optim")
    user = ("/home/u/train.py", 13, "opt_step")
    assert break_origin([user, (os.path.join(optim, "optimizer.py"), 79, "_use_grad")]) == ORIGIN_OPTIMIZER_STEP
    skipped = ("Dynamo developers have intentionally marked that the function `Adam.step` in file "
               f"`/venv/lib/{optim}/lr_scheduler.py` should not be traced.")
    assert break_origin([user], skipped) == ORIGIN_OPTIMIZER_STEP
    assert break_origin([(os.path.join(optim, "optimizer.py"), 500, "step"), user]) == ""  # a closure the step calls
    assert break_origin([user]) == ""
    gb = GraphBreak(SourceLocation("t.py", 14, "train_step", "opt.step()"), "Call to `torch._dynamo.graph_break()`",
                    origin=ORIGIN_OPTIMIZER_STEP)
    explained, fixes = fixcatalog.graph_break_fixes(gb)
    assert "by design" in explained and "not a graph_break() you wrote" in explained and fixes == []
    report = assemble([gb], RunInfo(target="t.py"))
    assert common.counts(report).graph_breaks == 0
    assert "Optimizer step" in render(report, "terminal") and "graph-break" not in render(report, "terminal")
    assert not [r for r in json.loads(render(report, "sarif"))["runs"][0]["results"] if r["ruleId"] == "graph-break"]


def test_a_recompile_on_an_optimizers_learning_rate_offers_a_tensor_learning_rate():
    (fix,) = fixcatalog.recompile_fixes("value", "self.param_groups[0].lr", None)
    assert "torch.optim.AdamW(params, lr=torch.tensor(1e-3))" in fix.title
    assert fixcatalog.recompile_fixes("value", "scale", None)[0].title == "pass scale as a tensor (torch.tensor(scale))"



def test_a_recompile_on_a_bool_flag_is_offered_neither_a_tensor_nor_dynamic_true():
    """Mixtral's cache layers (transformers 5.17) mark themselves initialized: the guard
    `past_key_values.layers[1].is_initialized == False` failed, and "pass it as a tensor"
    (not the user's variable) and dynamic=True (bools stay constant; tried, did not work)
    were offered."""
    g = tracetext.translate_guard("11/7: L['past_key_values'].layers[1].is_initialized == False"
                                  "        # if not self.is_initialized:  # transformers/cache_utils.py:143 in update",
                                  "forward")
    (fix,) = fixcatalog.recompile_fixes(g.kind, g.input_name, g.dim, value=g.old)
    assert fix.cause == "bool-flag" and fix.edit == ""
    assert "dynamic=True does not change that" in fix.detail


LOGGER_BREAK = """Graph break in user code at /venv/lib/transformers/modeling_utils.py:5120
Graph Break Reason: logging.Logger method not supported for non-export cases
  Explanation: logging.Logger methods are not supported for non-export cases.
  Hint: Add the logging method to `torch._dynamo.config.ignore_logging_functions`.

  Developer debug context: method: <Logger transformers.modeling_utils (WARNING)>.warning_once, args: []
"""


def test_a_logger_call_in_library_code_offers_ignore_logging_functions_placed_after_the_imports():
    """transformers logs from a model's forward (warning_once, which it adds to logging.Logger):
    the break is at the user's model call, where there is no logging call to remove."""
    from fuselens.capture.tracetext import parse_graph_break
    from fuselens.server.fixes import apply_edits, ignore_logging_fix
    from fuselens.server.source_index import SourceIndex

    parsed = parse_graph_break(LOGGER_BREAK)
    assert parsed.debug_context.startswith("method: <Logger transformers.modeling_utils (WARNING)>.warning_once")
    gb = GraphBreak(SourceLocation("train.py", 9, "<module>", "loss = model(ids).loss"), parsed.reason,
                    explanation=parsed.explanation)
    explained, (fix,) = fixcatalog.graph_break_fixes(gb, parsed.debug_context)
    assert "logging.Logger.warning_once" in explained
    assert (fix.edit, fix.args) == ("ignore_logging", ["warning_once"])
    program = "import torch\nimport transformers\n\nmodel = torch.compile(transformers.GPT2LMHeadModel(cfg))\n"
    fixed = apply_edits(program, ignore_logging_fix(SourceIndex(program), "warning_once").edits)
    assert fixed.splitlines()[:4] == ["import torch", "import transformers", "import logging",
                                      "torch._dynamo.config.ignore_logging_functions.add(logging.Logger.warning_once)"]
    assert ignore_logging_fix(SourceIndex(fixed), "warning_once") is None  # applied once


def test_a_library_model_compiled_by_assignment_gets_edits_at_its_compile_call_and_its_callers():
    """`model = torch.compile(model)` of a transformers model (no def or class here), called as
    `model(input_ids=ids)` inside `print(float(...))`: the fixes' edits were "could not apply",
    shown as "tried: did not work", and the recompile was named after `print`."""
    from fuselens.server.fixes import apply_edits, dynamic_true_fix, mark_dynamic_fix
    from fuselens.server.source_index import SourceIndex

    with open(os.path.join(REAL, "hf_bert_varlen.py"), encoding="utf-8") as f:
        source = f.read()
    index = SourceIndex(source)
    site = index.site_for("model")
    assert site is not None and site.call is not None
    assert "dynamic=True)" in apply_edits(source, dynamic_true_fix(index, site).edits)
    ((call, stmt),) = [(c, s) for c, s in index.call_sites(site) if "labels=labels)" in index.text(c)
                       and s.lineno == 20]
    fixed = apply_edits(source, mark_dynamic_fix(index, site, call, stmt, "ids", 1).edits)
    assert "    torch._dynamo.mark_dynamic(ids, 1)\n    out = model(" in fixed
    assert callsite.parse_call('print("eval", float(model(input_ids=ids).loss))').callee == "model"
    assert common.fix_label(FixAdvice("input-size", "compile with dynamic=True", verified=None))[1] == \
        "compile with dynamic=True"


def test_an_attribute_set_after_the_first_call_is_named_with_advice_to_set_it_before():
    """transformers' BertForSequenceClassification sets config.problem_type on its first call:
    the second call recompiles on `self.config.problem_type is None`, shown as a bare "guard
    failed" with no advice. Set before compiling, the recompile is gone (checked on that loop)."""
    raw = ("0/0: self.config.problem_type is None # if self.config.problem_type is None: "
           "# transformers/models/bert/modeling_bert.py:1115 in forward")
    from fuselens.capture.tracetext import translate_guard
    g = translate_guard(raw, "forward")
    assert (g.kind, g.input_name) == ("none_check", "self.config.problem_type")
    assert g.text.startswith("'self.config.problem_type' is no longer None")
    (fix,) = fixcatalog.recompile_fixes(g.kind, g.input_name, None)
    assert fix.title.startswith("give self.config.problem_type its value before the first call")
    assert translate_guard("0/0: L['self'].cache is not None", "forward").text.startswith("'self.cache' is now None")


def test_nonzero_graph_break_offers_capture_dynamic_output_shape_ops():
    gb = GraphBreak(SourceLocation("r.py", 13, "forward", "p = m.nonzero()"), "Dynamic shape operator")
    _, fixes = fixcatalog.graph_break_fixes(gb)
    assert fixes[0].args == ["torch._dynamo.config.capture_dynamic_output_shape_ops", "True"]


def test_bytes_and_globals_get_no_dynamic_true_fix_that_cannot_work():
    for kind in ("object_value", "global_value"):
        assert all(f.edit != "dynamic_true" for f in fixcatalog.recompile_fixes(kind, "k", None))


def test_library_wrapper_inputs_are_named_by_the_users_call():
    call = callsite.parse_call("logits = compiled(input_ids, mask=m).logits")
    assert callsite.user_argument("args[0]", call) == "input_ids"
    assert callsite.user_argument("kwargs['mask']", call) == "m"


def test_fallbacks_are_not_errors_and_have_their_own_fail_on_categories():
    r = Report(run=RunInfo(target="p.py"), errors=[ErrorEntry("fallback", "sort runs in ATen"),
                                                    ErrorEntry("compile", "graph ran eagerly")])
    assert common.failing_findings(r, ["error"]) == []
    assert common.failing_findings(r, ["fallback", "eager-fallback"]) == ["fallback", "eager-fallback"]


def test_a_compile_failure_the_program_raised_is_one_error_not_also_an_eager_fallback():
    failed = ErrorEntry("compile", "BackendCompilerFailed: backend='broken' raised", compile_id="0/0")
    raised = ErrorEntry("exception", "fails only under torch.compile (raised in torch.compile): "
                                     "BackendCompilerFailed: backend='broken' raised:")
    elsewhere = ErrorEntry("compile", "Unsupported: Failed to trace builtin operator", compile_id="1/0")
    report = assemble([failed, elsewhere, raised], RunInfo(target="p.py"))
    # The failure that raised is reported once; one that fell back to eager stays a note.
    assert report.errors == [elsewhere, raised]
    assert common.failing_findings(report, ["error", "eager-fallback"]) == ["error", "eager-fallback"]


def test_the_workers_cache_mode_reaches_the_report_header():
    report = assemble([RunInfo(target="", caches="cold", torch_version="2.13.0")], RunInfo(target="p.py"))
    assert (report.run.target, report.run.caches) == ("p.py", "cold")
    assert "cold caches" in render(report, "terminal")


# -- real programs -----------------------------------------------------------------
CORRECT = ["global_dict.py", "bytes_key.py", "nonzero_route.py", "autocast_switch.py", "train_step.py",
           "compiled_optimizer.py", "logger_in_forward.py"]


@pytest.mark.slow
@pytest.mark.parametrize("program", CORRECT)
def test_fail_on_error_exits_0_on_a_program_that_ran_correctly(program):
    proc = _cli(program, "--fail-on", "error", "--no-verify-fixes", "-q")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


# Every program of ours that runs correctly: the corpus of issue 18 and the examples
# (folder, file, --max-calls).
RUN_CORRECTLY = [(REAL, p, None) for p in [*CORRECT, "dtype_switch.py", "intermediate_shape.py", "hf_gpt2.py"]]
RUN_CORRECTLY += [(os.path.join(ROOT, "examples"), p, calls) for p, calls in
                  [("demo.py", None), ("data_dependent.py", None), ("train_loop.py", 3)]]


def _strings(node, key=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)
    elif isinstance(node, str):
        yield key, node


@pytest.mark.slow
@pytest.mark.parametrize("folder,program,max_calls", RUN_CORRECTLY, ids=[p for _, p, _ in RUN_CORRECTLY])
def test_a_correct_program_has_no_error_fits_150_lines_bounds_values_and_points_at_its_own_lines(
        folder, program, max_calls):
    report = analyze(Target.from_cli([program], cwd=folder), RunOptions(timeout_s=240, max_calls=max_calls))
    assert report.graph_breaks or report.recompiles or program == "train_loop.py", "the program has findings"
    assert common.failing_findings(report, ["error"]) == []  # what `--fail-on error` exits on
    assert report.run.caches == "warm"  # the report says which caches it used
    assert len(render(report, "terminal", width=120, root=folder).splitlines()) <= 150
    long = [(k, v[:80]) for k, v in _strings(json.loads(render(report, "json")))
            if len(v) > 200 and k not in common.UNCLIPPED_FIELDS]
    assert long == []
    located = [gb.location for gb in report.graph_breaks] + [rc.location for rc in report.recompiles]
    located += [e.location for e in report.errors]
    with open(os.path.join(folder, program), encoding="utf-8") as f:
        own_lines = len(f.read().splitlines())
    for loc in located:
        assert loc is not None and os.path.basename(loc.file) == program and 1 <= loc.line <= own_lines, loc


@pytest.mark.slow
def test_program_output_passes_through_and_report_fits_a_screen():
    proc = _cli("bytes_key.py", "--no-verify-fixes")
    assert "header bytes: 2049" in proc.stdout  # the program's own print
    assert len(proc.stdout.splitlines()) <= 150
    assert "bytes[2049]" in proc.stdout or "bytes[2049]" in _cli("bytes_key.py", "-v", "--no-verify-fixes").stdout


@pytest.mark.slow
def test_no_guard_value_longer_than_200_chars_in_any_format():
    report = analyze(Target.from_cli(["bytes_key.py"], cwd=REAL), RunOptions(timeout_s=120))
    assert report.recompiles
    for rc in report.recompiles:
        for text in rc.reasons + rc.raw_reasons + [s.old for s in rc.shape_changes] + [s.new for s in rc.shape_changes]:
            assert len(text) <= 200, text
    for fmt in ("json", "md", "html", "sarif", "terminal"):
        out = render(report, fmt, root=REAL, verbose=True)
        longest = max((len(m) for m in re.findall(r"b'(?:[^'\\…\n]|\\.)*", out)), default=0)
        assert longest <= 200, fmt


@pytest.mark.slow
def test_each_preferred_fix_applied_runs_and_removes_its_finding():
    proc = _cli("intermediate_shape.py", "-f", "json", "-o", "/tmp/fuselens_t18.json", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open("/tmp/fuselens_t18.json", encoding="utf-8") as f:
        report = Report.from_json(f.read())
    preferred = [(rc, f) for rc in report.recompiles for f in rc.fixes if f.preferred]
    assert preferred, "a verified fix is offered for the batch-size recompile"
    assert len({f.title for _, f in preferred}) == 1  # one preferred fix, never offered twice
    rc, fix = preferred[0]
    with open(os.path.join(REAL, "intermediate_shape.py"), encoding="utf-8") as f:
        source = f.read()
    fixed = edited_source(source, rc, fix)
    copy = os.path.join(REAL, ".fixed_intermediate_shape.py")
    with open(copy, "w", encoding="utf-8") as f:
        f.write(fixed)
    try:
        after = analyze(Target.from_cli([copy], cwd=REAL), RunOptions(timeout_s=120))
    finally:
        os.unlink(copy)
    assert not common.failures(after)
    assert not [r for r in after.recompiles if r.function == rc.function and r.cause == rc.cause]


def _run_edited(program: str, edit) -> Report:
    """The report of a copy of a corpus program with `edit` (source -> source) applied."""
    with open(os.path.join(REAL, program), encoding="utf-8") as f:
        fixed = edit(f.read())
    copy = os.path.join(REAL, f".fixed_{program}")
    with open(copy, "w", encoding="utf-8") as f:
        f.write(fixed)
    try:
        return analyze(Target.from_cli([copy], cwd=REAL), RunOptions(timeout_s=120))
    finally:
        os.unlink(copy)


@pytest.mark.slow
def test_a_compiled_optimizer_step_has_no_graph_break_finding_and_its_lr_fix_removes_the_recompile():
    """PyTorch's recipe, the step compiled alone, with an LR schedule: its graph breaks are
    torch's own (no finding, no fix); the schedule's new learning rates recompile the step, and
    the advice, a tensor learning rate, applied, runs and removes the recompile."""
    report = analyze(Target.from_cli(["compiled_optimizer.py"], cwd=REAL), RunOptions(timeout_s=120))
    assert report.graph_breaks and all(gb.origin == "optimizer-step" and not gb.fixes for gb in report.graph_breaks)
    assert common.counts(report).graph_breaks == 0 and not common.failures(report)
    (rc,) = report.recompiles
    assert "lr=torch.tensor(1e-3)" in rc.fixes[0].title
    after = _run_edited("compiled_optimizer.py", lambda source: source.replace("lr=0.01", "lr=torch.tensor(0.01)"))
    assert after.run.exit_code == 0 and not common.failures(after) and after.recompiles == []


@pytest.mark.slow
def test_the_logging_fix_applied_runs_and_removes_the_graph_break():
    report = analyze(Target.from_cli(["logger_in_forward.py"], cwd=REAL), RunOptions(timeout_s=120))
    (gb,) = report.graph_breaks
    (fix,) = gb.fixes
    assert fix.edit == "ignore_logging" and fix.args == ["warning"]
    after = _run_edited("logger_in_forward.py", lambda source: edited_source(source, gb, fix))
    assert after.run.exit_code == 0 and not common.failures(after) and after.graph_breaks == []


@pytest.mark.slow
def test_a_padded_batch_recompile_of_a_library_model_gets_a_verified_fix_and_its_eval_call_its_name():
    report = analyze(Target.from_cli(["hf_bert_varlen.py"], cwd=REAL), RunOptions(timeout_s=240))
    verify.verify_report(report, os.path.join(REAL, "hf_bert_varlen.py"),
                         lambda path: analyze(Target.from_cli([path], cwd=REAL), RunOptions(timeout_s=240)))
    size, grad = report.recompiles
    assert (size.function, size.cause, grad.function, grad.cause) == ("model", "input-size", "model", "grad-mode")
    assert [f.title for f in size.fixes if f.preferred] and all(f.verified is not False for f in size.fixes)


@pytest.mark.slow
def test_hf_model_recompile_points_at_the_users_call_and_names_its_variable():
    report = analyze(Target.from_cli(["hf_gpt2.py"], cwd=REAL), RunOptions(timeout_s=240))
    assert report.recompiles
    rc = report.recompiles[0]
    assert rc.location.file.endswith("hf_gpt2.py") and rc.location.line == 15
    assert "input_ids" in rc.fixes[0].title
    assert len(render(report, "terminal", width=120).splitlines()) <= 150


def test_a_hang_names_the_line_it_was_stuck_on():
    report = analyze(Target.from_cli(["hang.py"], cwd=REAL), RunOptions(timeout_s=2))
    (err,) = common.failures(report)
    assert err.kind == "timeout" and err.location is not None
    assert (os.path.basename(err.location.file), err.location.line) == ("hang.py", 7)


def test_a_segfault_names_the_line_that_crashed():
    report = analyze(Target.from_cli(["segfault.py"], cwd=REAL), RunOptions(timeout_s=60))
    (err,) = common.failures(report)
    assert err.kind == "killed" and err.location is not None
    assert (os.path.basename(err.location.file), err.location.line) == ("segfault.py", 6)


def test_a_crash_inside_torch_compile_is_labelled_compile_only_and_suggests_backend_eager():
    report = analyze(Target.from_cli(["compile_only_crash.py"], cwd=REAL), RunOptions(timeout_s=120))
    (err,) = common.failures(report)
    assert [e.kind for e in report.errors] == ["exception"]  # fullgraph raised: no eager-fallback note too
    assert err.message.startswith("fails only under torch.compile (raised in torch._dynamo, tracing step at "
                                  "compile_only_crash.py:9)")
    assert "--backend eager" in err.explained
    assert (os.path.basename(err.location.file), err.location.line) == ("compile_only_crash.py", 13)
    for fmt in ("terminal", "md", "html", "sarif"):
        out = render(report, fmt, root=REAL)
        assert "fails only under torch.compile" in out and "--backend eager" in out, fmt


def test_an_exception_raised_on_the_users_own_line_is_not_labelled_compile_only():
    report = analyze(Target.from_cli(["user_raise.py"], cwd=REAL), RunOptions(timeout_s=120))
    (err,) = common.failures(report)
    assert err.message.startswith("ValueError: expected 3 rows")
    assert err.explained == ""
    assert (os.path.basename(err.location.file), err.location.line) == ("user_raise.py", 9)


def test_compile_only_explanation_fits_200_chars_so_the_backend_eager_advice_is_never_cut():
    from fuselens.capture import compilecrash

    _, explained = compilecrash.labelled("RuntimeError: x", "torch._inductor (lowering.py:1 in f)")
    assert len(explained) <= guardtext.MAX_TEXT and "--backend eager" in explained


@pytest.mark.slow
def test_a_custom_op_whose_backward_cannot_be_traced_is_one_finding_and_its_backend_fix_removes_it():
    """The backend's failure (AOTAutograd cannot trace the op's backward) makes Dynamo break
    the graph in every frame around the op: one finding, at the user's call, naming the
    backward's line, with no capture_scalar_outputs (which cannot help); fuselens, which
    compiles around the op, applied, runs the program in one graph."""
    program = "custom_op_backward.py"
    report = analyze(Target.from_cli([program], cwd=REAL), RunOptions(timeout_s=120))
    assert report.run.exit_code == 0
    (gb,) = report.graph_breaks
    assert gb.reason == "the aot_eager compiler failed with aten._local_scalar_dense.default"
    assert "custom_op_backward.py:32 (_backward)" in gb.explained
    (fix, _) = gb.fixes
    assert fix.edit == "backend" and fix.args == ["fuselens"]
    verify.verify_report(report, os.path.join(REAL, program),
                         lambda path: analyze(Target.from_cli([path], cwd=REAL), RunOptions(timeout_s=120)))
    assert fix.verified and fix.preferred
    after = _run_edited(program, lambda source: edited_source(source, gb, fix))
    assert after.run.exit_code == 0 and after.graph_breaks == [] and len(after.graphs) >= 1
    assert any("corpus::grouped_mm runs eagerly between compiled parts" in e.message for e in after.errors)
