"""Compiler options are defined once (fuselens/compiler/options.py) and set the
same way from everywhere: `--set NAME=VALUE` of `fuselens report` and `fuselens
tui`, the server's setting, the Python API; a run's options reach the backend
with each compile, never through a process-wide default."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fuselens.capture import RunOptions, Target, WorkerSession
from fuselens.compiler import options
from fuselens.report import cli as report_cli

REPO = Path(__file__).parent.parent

PROGRAM = """import torch


def f(x):
    return (x.sin() + 1).cos() * 2


torch.compile(f, backend={backend!r}{extra})(torch.randn(64))
"""
FUSED = ["cpp_fused_add_cos_mul_sin_0"]
UNFUSED = ["cpp_fused_sin_0", "cpp_fused_add_1", "cpp_fused_cos_2", "cpp_fused_mul_3"]


def _program(folder: Path, backend: str = "fuselens", extra: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "prog.py"
    path.write_text(PROGRAM.format(backend=backend, extra=extra))
    return path


# ---- one definition, parsed one way ---------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("fusion=off", ("fusion", False)),
    ("fusion=ON", ("fusion", True)),
    ("max_fusion_size=8", ("max_fusion_size", 8)),
    ("threads=auto", ("threads", 0)),
    ("compile_workers=auto", ("compile_workers", -1)),
    ("target=triton", ("target", "triton")),
    ("extra_cflags=-O3 -ffast-math", ("extra_cflags", ("-O3", "-ffast-math"))),
    ("cache_dir=none", ("cache_dir", None)),
    (" cxx = clang++ ", ("cxx", "clang++")),
])
def test_set_text_becomes_the_fields_type(text, expected):
    assert options.parse_assignment(text) == expected
    name, value = expected
    assert options.CompilerOptions().with_(**{name: value}) is not None  # the dataclass takes it


@pytest.mark.parametrize("text, message", [
    ("fusion", "expected NAME=VALUE"),
    ("nope=1", "unknown fuselens compiler option(s) 'nope'; valid options: fusion, max_fusion_size,"),
    ("max_fusion_size=0", "option max_fusion_size must be >= 1"),
    ("max_fusion_size=big", "option max_fusion_size: 'big' is not an integer"),
    ("fusion=maybe", "option fusion: 'maybe' is not on/off"),
    ("target=cuda", "option target must be one of 'cpp', 'triton', 'auto', not 'cuda'"),
    ("source_hook=x", "option source_hook can only be set from Python"),
])
def test_bad_set_text_says_which_option_and_why(text, message):
    with pytest.raises(ValueError) as err:
        options.parse_assignment(text)
    assert message in str(err.value)


def test_json_values_are_checked_not_coerced():
    assert options.validated({"fusion": False, "extra_cflags": ["-O2"]}) == {"fusion": False, "extra_cflags": ("-O2",)}
    for bad in ({"fusion": 1}, {"max_fusion_size": True}, {"max_fusion_size": 2.5}, {"cxx": 3}):
        with pytest.raises(ValueError):
            options.validated(bad)


def test_the_python_api_rejects_what_set_rejects():
    with pytest.raises(options.UnknownOptionError):
        options.resolve({"nope": 1})
    with pytest.raises(ValueError, match="max_fusion_size must be >= 1"):
        options.CompilerOptions().with_(max_fusion_size=0)


def test_every_field_has_a_label_and_toggle_choices_start_with_the_default():
    for field in options.FIELDS.values():
        assert field.metadata["label"], field.name
        choices = field.metadata["choices"]
        if choices:
            assert choices[0] == field.default
            for value in choices:
                assert options.parse_value(field.name, value) == value


# ---- importing and registering --------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_importing_compiler_options_imports_no_torch_and_registers_nothing():
    result = _python("import sys, fuselens.compiler.options, fuselens.compiler\n"
                     "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
                     "print(sorted(m for m in sys.modules if m.startswith('fuselens.compiler')))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "['fuselens.compiler', 'fuselens.compiler.options']"]


def test_register_makes_the_backend_known_to_dynamo_and_can_be_called_twice():
    result = _python(
        "import torch, fuselens.compiler as fc\n"
        "from torch._dynamo.backends.registry import lookup_backend\n"
        "fc.register(); fc.register()\n"
        "assert lookup_backend('fuselens') is fc.fuselens_backend\n"
        "print(torch.compile(lambda x: x + 1, backend='fuselens')(torch.zeros(2)).tolist())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1.0, 1.0]"


# ---- a run's options reach the backend --------------------------------------


def test_a_runs_options_reach_the_backend_and_do_not_outlive_the_run(tmp_path):
    with WorkerSession(Target.from_cli([str(_program(tmp_path))])) as session:
        unfused = session.run(RunOptions(compiler_options={"fusion": False}))
        plain = session.run(RunOptions())  # same worker: nothing left from the run before
        bad = session.run(RunOptions(compiler_options={"max_fusion_size": 0}))
    assert [k.name for k in unfused.kernels] == UNFUSED
    assert [k.name for k in plain.kernels] == FUSED
    assert [k.name for k in bad.kernels] == FUSED
    assert [e.message for e in bad.errors] == ["fuselens compiler options not used: option max_fusion_size must be >= 1"]


def test_a_forced_fuselens_backend_gets_the_runs_options_and_the_programs_own_options_win(tmp_path):
    eager = _program(tmp_path / "eager", "eager")
    own = _program(tmp_path / "own", extra=", options={'fusion': True}")
    no_fusion = RunOptions(compiler_options={"fusion": False})
    with WorkerSession(Target.from_cli([str(eager)])) as session:
        forced = session.run(dataclasses.replace(no_fusion, backend="fuselens"))
    with WorkerSession(Target.from_cli([str(own)])) as session:
        program_wins = session.run(no_fusion)
    assert [k.name for k in forced.kernels] == UNFUSED
    assert [k.name for k in program_wins.kernels] == FUSED


def test_report_set_runs_the_program_with_those_options(tmp_path, capsys):
    prog = _program(tmp_path)
    code = report_cli.main(["--set", "fusion=off", "--no-verify-fixes", "-q", "-f", "json", str(prog)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert [k["name"] for k in report["kernels"]] == UNFUSED


@pytest.mark.parametrize("item, message", [
    ("bogus=1", "argument --set: unknown fuselens compiler option(s) 'bogus'"),
    ("max_fusion_size=0", "argument --set: option max_fusion_size must be >= 1"),
])
def test_report_bad_set_exits_2_before_running_anything(tmp_path, capsys, item, message):
    assert report_cli.main(["--set", item, str(_program(tmp_path))]) == report_cli.EXIT_USAGE
    assert message in capsys.readouterr().err
