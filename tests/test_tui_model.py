"""The numbers the TUI shows (fuselens.tui.model), the toggles it offers
(fuselens.tui.toggles) and the py-spy parsing (fuselens.tui.sampling),
without an app."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fuselens import present
from fuselens.capture.target import RunOptions
from fuselens.compiler.options import CompilerOptions
from fuselens.events import Kernel, Report, RunInfo
from fuselens.tui import model
from fuselens.tui.sampling import Sampler, categorize, parse_speedscope, py_spy_path
from fuselens.tui.toggles import TOGGLES, ToggleState, format_value

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def load(name: str) -> Report:
    return Report.from_json((FIXTURES / name).read_text())


@pytest.fixture
def run_a() -> Report:
    return load("tui_report_a.json")


@pytest.fixture
def run_b() -> Report:
    return load("tui_report_b.json")


# ---- kernel rows and differences -------------------------------------


def _with_times(report: Report, times: dict[str, float], extra: list[Kernel] = ()) -> Report:
    """A copy of `report` whose kernels (by name) take the given total times."""
    copy = Report.from_json(report.to_json())
    for k in copy.kernels:
        k.total_time_us = times.get(k.name, k.total_time_us)
    copy.kernels.extend(extra)
    return copy


def test_noise_is_the_spread_of_a_kernels_time_over_runs_with_the_same_toggles(run_b):
    # issue 19.11: three runs of one configuration; extern_mm_0 swings 1795 -> 900 -> 1795 (±100%)
    runs = [run_b, _with_times(run_b, {"extern_mm_0": 900.0}), _with_times(run_b, {"extern_mm_0": 1795.0})]
    noise = model.kernel_noise(runs, ["fusion=off"] * 3)
    assert noise["0/0:dynamo/extern_mm_0"] == pytest.approx(895.0)
    assert noise["0/0:dynamo/cpp_gelu_1"] == 0.0
    # a different configuration is not a repeat: one run of each measures nothing
    assert model.kernel_noise([run_b, runs[1]], ["fusion=on", "fusion=off"]) == {}
    # a swing within the noise is "~", not a difference
    rows = {r.name: r for r in model.kernel_rows(runs[2], runs[1], noise)}
    mm = rows["extern_mm_0"]
    assert mm.delta_us == pytest.approx(895.0) and mm.noise_us == pytest.approx(895.0)
    assert mm.significant is False and model.delta_text(mm) == ("~", "noise")


def test_a_difference_beyond_the_noise_is_shown_and_unmeasured_noise_is_marked(run_b):
    runs = [run_b, _with_times(run_b, {"cpp_gelu_1": 1300.0})]
    noise = model.kernel_noise(runs, ["x", "x"])  # cpp_gelu_1: 10 µs of noise
    slower = _with_times(run_b, {"cpp_gelu_1": 2600.0})
    gelu = {r.name: r for r in model.kernel_rows(slower, runs[1], noise)}["cpp_gelu_1"]
    assert gelu.significant is True
    assert model.delta_text(gelu) == ("+1.30 ms +100%", "worse")
    # no repeated runs: the raw difference with "?", never red or green
    gelu = {r.name: r for r in model.kernel_rows(slower, run_b)}["cpp_gelu_1"]
    assert gelu.noise_us is None and gelu.significant is None
    assert model.delta_text(gelu) == ("+1.31 ms +102% ?", "unmeasured")
    # sorting by delta ranks differences within the noise as no difference
    within = model.kernel_rows(_with_times(run_b, {"extern_mm_0": 3000.0}), run_b, {"0/0:dynamo/extern_mm_0": 5000.0})
    assert model.sort_rows(within, "delta")[0].name != "extern_mm_0"


def test_graph_label_tells_kernels_of_the_same_name_apart():
    assert model.graph_label("0/0:dynamo") == "0/0"
    assert model.graph_label("1/2:dynamo#1") == "1/2#1"
    assert model.graph_label("0/0:aot_backward") == "0/0 bwd"
    assert model.graph_label("") == ""
    a = Kernel(name="cpp_fused_mean_0", kind="cpp", graph_id="0/0:dynamo", calls=1, total_time_us=5.0)
    b = Kernel(name="cpp_fused_mean_0", kind="cpp", graph_id="0/1:dynamo", calls=1, total_time_us=7.0)
    rows = model.sort_rows(model.kernel_rows(Report(RunInfo(target="t"), kernels=[b, a])), "graph")
    assert [model.graph_label(r.graph_id) for r in rows] == ["0/0", "0/1"]


def test_first_run_rows_have_share_mean_and_bandwidth_but_no_delta(run_a):
    rows = {r.name: r for r in model.kernel_rows(run_a)}
    ln = rows["cpp_fused_layer_norm_gelu_0"]
    assert ln.status == "first" and ln.delta_us is None
    assert ln.mean_us == pytest.approx(2960.0 / 8)
    assert ln.share == pytest.approx(2960.0 / 5421.6)
    # 196608 bytes per call x 8 calls over 2960 µs.
    assert ln.bandwidth_gbs == pytest.approx(196608 * 8 / 2960e3)
    assert ln.user_lines == "train_step.py:11,12"
    assert sum(r.share for r in rows.values()) == pytest.approx(1.0)


def test_rows_against_previous_run_mark_same_new_and_gone_kernels(run_a, run_b):
    rows = {r.name: r for r in model.kernel_rows(run_b, run_a)}
    assert rows["extern_mm_0"].status == "same"
    assert rows["extern_mm_0"].delta_us == pytest.approx(1795.0 - 1840.0)
    assert rows["cpp_layer_norm_0"].status == "new" and rows["cpp_layer_norm_0"].delta_us is None
    gone = rows["cpp_fused_layer_norm_gelu_0"]
    assert gone.status == "gone" and gone.delta_us == pytest.approx(-2960.0) and gone.share is None
    assert len(rows) == len(run_b.kernels) + 2  # the two fused kernels that split up


def test_kernels_match_by_name_when_graph_ids_were_renumbered(run_a):
    renumbered = Report.from_dict(run_a.to_dict())
    for k in renumbered.kernels:
        k.graph_id = "7/0:dynamo"
        k.total_time_us *= 2
    rows = model.kernel_rows(renumbered, run_a)
    assert {r.status for r in rows} == {"same"}
    assert all(r.delta_us == pytest.approx(r.total_us / 2) for r in rows)


def test_sorting_puts_largest_first_and_gone_kernels_last(run_a, run_b):
    rows = model.kernel_rows(run_b, run_a)
    by_total = model.sort_rows(rows, "total")
    assert by_total[0].name == "cpp_layer_norm_0"
    assert [r.status for r in by_total[-2:]] == ["gone", "gone"]
    by_name = model.sort_rows(rows, "name")
    live = [r.name for r in by_name if r.status != "gone"]
    assert live == sorted(live)
    by_calls_asc = model.sort_rows(rows, "calls", reverse=False)
    assert by_calls_asc[0].calls <= by_calls_asc[-1].calls


def test_summary_counts_breaks_recompiles_and_wall_per_step(run_a):
    s = model.summarize(run_a)
    assert (s.graphs, s.breaks, s.recompiles, s.kernels) == (2, 8, 1, 5)
    assert s.steps == 8
    assert s.wall_per_step_s == pytest.approx(3.482 / 8)
    assert s.kernel_us == pytest.approx(5421.6)


def test_steps_is_zero_and_wall_per_step_unknown_without_timed_kernels():
    report = Report(RunInfo("x.py"), kernels=[Kernel("k", "cpp")])
    assert model.steps(report) == 0 and model.summarize(report).wall_per_step_s is None


def test_decisions_for_a_kernel_include_not_fused_pairs_with_reasons(run_a):
    kernel = next(k for k in run_a.kernels if k.name == "cpp_fused_layer_norm_gelu_0")
    fused, not_fused = model.decisions_for(run_a, kernel)
    assert [d.nodes for d in fused] == [["layer_norm", "gelu"]]
    assert [d.nodes for d in not_fused] == [["gelu", "mm"]]
    assert "extern" in not_fused[0].reason


def test_durations_read_in_the_right_unit_with_three_digits():
    assert present.duration_us(812.4) == "812 µs"
    assert present.duration_us(3404.0) == "3.40 ms"
    assert present.duration_us(43_000.0) == "43.0 ms"
    assert present.duration_us(1.25e6) == "1.25 s"
    assert present.duration_us(None) == "—"
    assert model.format_delta_us(-750.0, 3000.0) == "−750 µs −25%"
    assert model.format_delta_us(1200.0) == "+1.20 ms"


# ---- toggles ---------------------------------------------------------


def test_toggle_state_sends_only_changed_options_of_the_selected_backend():
    state = ToggleState(backend="fuselens")
    state.set("fuselens:fusion", False)
    state.cycle("fuselens:max_fusion_size")  # 64 -> 32
    state.set("inductor:max_autotune", True)  # another backend: not sent
    base = RunOptions(timeout_s=30.0, time_kernels=True)
    opts = state.options(base)
    assert opts.backend == "fuselens"
    assert opts.compiler_options == {"fusion": False, "max_fusion_size": 32}
    assert opts.inductor_config == {}
    assert (opts.timeout_s, opts.time_kernels) == (30.0, True)
    assert base.compiler_options is None  # the base is not mutated
    assert state.describe() == "backend=fuselens fusion=off max_fusion_size=32"


def test_inductor_backend_sends_inductor_config_and_program_backend_sends_none():
    state = ToggleState(backend="inductor")
    state.set("inductor:triton.cudagraphs", True)
    state.set("fuselens:fusion", False)
    opts = state.options(RunOptions())
    assert opts.backend == "inductor" and opts.compiler_options is None
    assert opts.inductor_config == {"triton.cudagraphs": True}
    program = ToggleState()
    assert program.options(RunOptions()).backend is None


def test_toggle_cycles_wrap_around_and_reject_unknown_values():
    state = ToggleState()
    key = "fuselens:target"
    assert [state.cycle(key) for _ in range(3)] == ["cpp", "triton", "auto"]
    assert state.cycle(key, -1) == "triton"
    with pytest.raises(ValueError):
        state.set(key, "cuda")
    threads = next(t for t in TOGGLES if t.key == "fuselens:threads")
    assert format_value(0, threads) == "auto" and format_value(4, threads) == "4"


def test_every_fuselens_toggle_is_a_compiler_option_field_with_choices():
    """The TUI keeps no list of its own: toggles are the fields whose metadata has
    choices, with the field's label, help and default (the first choice)."""
    fields = {f.name: f for f in dataclasses.fields(CompilerOptions)}
    offered = {t.name: t for t in TOGGLES if t.scope == "fuselens"}
    assert set(offered) == {name for name, f in fields.items() if f.metadata["choices"]}
    for name, toggle in offered.items():
        field = fields[name]
        assert toggle.values == field.metadata["choices"] and toggle.label == field.metadata["label"]
        assert toggle.default == field.default and toggle.help == field.metadata["help"]


def test_importing_the_toggles_and_compiler_options_does_not_import_torch():
    code = ("import sys, fuselens.tui.toggles, fuselens.compiler.options, fuselens.compiler; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_inductor_toggles_exist_in_the_installed_inductor_config():
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch not installed")
    source = (Path(spec.origin).parent / "_inductor" / "config.py").read_text()
    for toggle in TOGGLES:
        if toggle.scope != "inductor":
            continue
        *section, name = toggle.name.split(".")
        if section:
            body = source.split(f"class {section[0]}:", 1)
            assert len(body) == 2, f"no class {section[0]} in inductor config"
            source_part = body[1]
        else:
            source_part = source
        assert re.search(rf"^\s*{re.escape(name)}\s*(:[^=\n]*)?=", source_part, re.M), toggle.name


# ---- py-spy ----------------------------------------------------------


def test_speedscope_profile_folds_into_self_time_per_function_and_category():
    doc = json.loads((FIXTURES / "tui_host_profile.speedscope.json").read_text())
    profile = parse_speedscope(doc, ("/home/user/proj/",))
    assert profile.samples == 200 and profile.seconds == pytest.approx(2.0)
    top = profile.functions[0]
    assert (top.function, top.category) == ("compile_cpp", "compile")
    assert top.self_s == pytest.approx(0.63)
    user = next(f for f in profile.functions if f.function == "load_batch")
    assert user.category == "user" and user.line == 24
    assert profile.categories["wrapper"] == pytest.approx(0.27)
    assert sum(profile.categories.values()) == pytest.approx(2.0)


def test_frames_are_categorized_by_path():
    sp = "/venv/lib/python3.11/site-packages/"
    assert categorize(sp + "torch/_dynamo/convert_frame.py") == "compile"
    assert categorize(sp + "torch/_dynamo/eval_frame.py") == "wrapper"
    assert categorize("/tmp/torchinductor_root/ab/cab12.py") == "wrapper"
    assert categorize(sp + "torch/nn/modules/module.py") == "torch"
    assert categorize("/home/u/p/train.py", ("/home/u/p/",)) == "user"
    # A package installed inside the project's venv is not user code.
    assert categorize("/home/u/p/.venv/lib/site-packages/torch/fx/graph.py", ("/home/u/p/",)) == "compile"


@pytest.mark.skipif(py_spy_path() is None, reason="py-spy not installed")
def test_sampler_attaches_to_a_running_python_and_finds_its_hot_function(tmp_path):
    script = tmp_path / "spin.py"
    script.write_text(
        "import time\n"
        "def hot_loop():\n"
        "    s = 0\n"
        "    for i in range(200000):\n"
        "        s += i * i\n"
        "    return s\n"
        "end = time.time() + 20\n"
        "while time.time() < end:\n"
        "    hot_loop()\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.5)
        sampler = Sampler(rate=200, user_roots=(str(tmp_path) + os.sep,))
        sampler.start(proc.pid)
        time.sleep(1.5)
        profile = sampler.stop()
    finally:
        proc.kill()
        proc.wait()
    assert profile.error == ""
    assert profile.samples > 50
    assert profile.functions[0].function == "hot_loop"
    assert profile.functions[0].category == "user"


def test_sampler_reports_why_when_the_process_does_not_exist():
    sampler = Sampler()
    sampler.start(2**22 + 12345)  # no such pid
    profile = sampler.stop()
    assert profile.error and not profile.functions


# ---- the TUI process stays light -------------------------------------


def test_tui_modules_never_import_torch():
    code = (
        "import sys\n"
        "import fuselens.tui.cli, fuselens.tui.app, fuselens.tui.detail, fuselens.tui.export\n"
        "import fuselens.capture\n"
        # The compiler's options are torch-free (the toggles are read from them); the rest is not.
        "light = {'fuselens.compiler', 'fuselens.compiler.options'}\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'fuselens.compiler'))\n"
        "             and m not in light)\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr

