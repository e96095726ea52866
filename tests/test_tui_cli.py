"""`fuselens tui` command line: option parsing and the errors that stop it
before an app starts (the app itself is tested in test_tui_pilot.py)."""

from __future__ import annotations

import pytest

from fuselens.cli import main as fuselens_main
from fuselens.cli import parse
from fuselens.run_args import parse_setting
from fuselens.tui import cli
from fuselens.tui.toggles import ToggleState


def test_own_options_before_the_target_are_ours_and_after_dashdash_the_programs():
    args, program = parse(["tui", "--backend", "eager", "--no-sample", "train.py", "--", "--epochs", "1"])
    assert (args.backend, args.no_sample, args.target) == ("eager", True, "train.py")
    assert program == ["--epochs", "1"]


def test_own_options_after_the_target_are_still_ours():
    args, program = parse(["tui", "model.py", "--backend", "fuselens", "--timeout=5", "--", "--backend", "x"])
    assert (args.target, args.backend, args.timeout) == ("model.py", "fuselens", 5.0)
    assert program == ["--backend", "x"]
    args, program = parse(["tui", "-m", "pkg.train", "--no-sample"])
    assert (args.module, args.target, args.no_sample, program) == ("pkg.train", None, True, [])


def test_an_unknown_option_before_dashdash_is_an_error_not_the_programs(capsys, tmp_path):
    script = tmp_path / "model.py"
    script.write_text("pass\n")
    assert cli.main([str(script), "--lr", "3"]) == 2
    assert "unknown option '--lr'; the program's own arguments go after --" in capsys.readouterr().err


def test_an_abbreviated_option_is_unknown_not_guessed(capsys):
    assert cli.main(["--back", "eager", "x.py"]) == 2
    assert "unknown option '--back'" in capsys.readouterr().err


def test_a_target_and_a_module_together_are_refused(capsys, tmp_path):
    script = tmp_path / "model.py"
    script.write_text("pass\n")
    assert cli.main([str(script), "-m", "pkg.train"]) == 2
    assert "give either a target or -m MODULE, not both" in capsys.readouterr().err


def test_report_and_tui_share_one_definition_of_the_run_options():
    report, _ = parse(["report", "--backend", "eager", "--set", "fusion=off", "--max-calls", "2",
                       "--nproc-per-node", "2", "--run-dir", "d", "x.py"])
    tui, _ = parse(["tui", "--backend", "eager", "--set", "fusion=off", "--max-calls", "2",
                    "--nproc-per-node", "2", "--run-dir", "d", "x.py"])
    shared = ("target", "module", "backend", "settings", "max_calls", "nproc_per_node", "run_dir")
    assert {k: getattr(report, k) for k in shared} == {k: getattr(tui, k) for k in shared}
    assert report.settings[0].value is False  # parsed by the compiler's options, not left as text


def test_a_second_positional_before_dashdash_says_program_arguments_go_after_it(capsys):
    assert cli.main(["model.py", "3"]) == 2
    assert "go after --" in capsys.readouterr().err


def test_set_starts_with_named_toggles_and_accepts_on_off_auto():
    state = ToggleState(backend="fuselens")
    cli.apply_sets(state, settings("fuselens:fusion=off", "fuselens:max_fusion_size=8", "fuselens:threads=auto"))
    assert state.get("fuselens:fusion") is False
    assert state.get("fuselens:max_fusion_size") == 8
    assert state.get("fuselens:threads") == 0


def test_missing_target_exits_2_with_a_one_line_message(capsys, tmp_path):
    assert fuselens_main(["tui", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "nope.py: no such file" in err and len(err.strip().splitlines()) == 1


def test_set_takes_any_compiler_option_as_name_equals_value_like_report():
    state = ToggleState(backend="fuselens")
    extra = cli.apply_sets(state, settings("fusion=off", "max_fusion_size=3", "cxx=clang++", "inductor:max_autotune=on"))
    assert state.get("fuselens:fusion") is False
    assert state.get("fuselens:max_fusion_size") == 3  # valid although the toggle does not cycle through it
    assert state.get("inductor:max_autotune") is True
    assert extra == {"cxx": "clang++"}  # not a toggle: sent with every run
    assert state.options(cli_run_options(extra)).compiler_options == {"cxx": "clang++", "fusion": False,
                                                                      "max_fusion_size": 3}


def settings(*items):
    return [parse_setting(item) for item in items]


def cli_run_options(extra):
    from fuselens.capture.target import RunOptions

    return RunOptions(compiler_options=extra)


@pytest.mark.parametrize("item, message", [
    ("nonsense=1", "unknown fuselens compiler option(s) 'nonsense'"),
    ("fuselens:nonsense=1", "unknown fuselens compiler option(s) 'nonsense'"),
    ("max_fusion_size=0", "option max_fusion_size must be >= 1"),
    ("fusion=maybe", "option fusion: 'maybe' is not on/off"),
    ("inductor:nonsense=1", "SCOPE:NAME one of inductor:"),
])
def test_a_bad_set_exits_2_and_says_what_is_wrong(capsys, item, message):
    assert cli.main(["--set", item, "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fuselens tui:") and message in err


def test_an_unreadable_replay_file_exits_2(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli.main(["--replay", str(bad)]) == 2
    assert "cannot read report" in capsys.readouterr().err


def test_tui_runs_have_a_default_timeout_that_zero_turns_off_while_report_runs_have_none():
    from fuselens.run_args import run_options

    tui, _ = parse(["tui", "x.py"])
    assert run_options(tui, {}).timeout_s == cli.DEFAULT_TIMEOUT_S
    tui, _ = parse(["tui", "--timeout", "0", "x.py"])
    assert run_options(tui, {}).timeout_s is None
    report, _ = parse(["report", "x.py"])
    assert run_options(report, {}).timeout_s is None
