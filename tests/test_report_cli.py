"""`fuselens report`: arguments, exit codes, -o, and one real end-to-end run
of the command as a subprocess (backend eager: no Inductor compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fuselens.events import Report
from fuselens.report import common
from fuselens.report.cli import main
from report_helpers import DEMO_JSON, demo_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_usage_error(rc, out, err, *fragments):
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith("fuselens report: error: ")
    for f in fragments:
        assert f in lines[0]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        ([], "no target"),
        (["missing_script.py"], "missing_script.py: no such file"),
        (["--format", "xml", "x.py"], "invalid choice: 'xml'"),
        (["--timeout", "0", "x.py"], "--timeout: must be positive"),
        (["--timeout", "soon", "x.py"], "expected seconds"),
        (["--max-calls", "0", "x.py"], "--max-calls: must be at least 1"),
        (["--fail-on", "graph-breaks", "x.py"], "unknown category 'graph-breaks'"),
        (["--no-such-option", "x.py"], "unknown option '--no-such-option'"),
        (["x.py", "3"], "unexpected argument(s) 3; the program's own arguments go after --"),
        (["--set", "inductor:max_autotune=on", "x.py"], "switches are the TUI's"),
        (["-m"], "-m: expected one argument"),
        (["-m", "not a module"], "-m needs a module name"),
        (["--from-json", "missing.json"], "missing.json: no such file"),
        (["--from-json", DEMO_JSON, "x.py"], "give no target"),
    ],
)
def test_bad_arguments_are_one_line_errors_with_exit_code_2(argv, fragment, capsys):
    assert_one_line_usage_error(*run_main(argv, capsys), fragment)


def test_a_file_that_is_not_python_is_a_usage_error(tmp_path, capsys):
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    assert_one_line_usage_error(*run_main([str(data)], capsys), "not a Python script")


def test_a_directory_is_a_usage_error(tmp_path, capsys):
    assert_one_line_usage_error(*run_main([str(tmp_path)], capsys), "is a directory")


def test_extra_words_before_double_dash_are_refused_with_a_hint(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    assert_one_line_usage_error(*run_main([str(script), "--epochs", "1"], capsys), "go after --")


def test_unwritable_output_is_refused_before_running(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("raise SystemExit('must not run')\n")
    rc, out, err = run_main([str(script), "-o", str(tmp_path / "no" / "such" / "r.html")], capsys)
    assert_one_line_usage_error(rc, out, err, "does not exist")


def test_garbage_json_report_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "r.json"
    bad.write_text("{not json")
    assert_one_line_usage_error(*run_main(["--from-json", str(bad)], capsys), "not a fuselens JSON report")


def test_help_prints_exit_codes_and_returns_0(capsys):
    rc, out, _ = run_main(["--help"], capsys)
    assert rc == 0
    assert "exit codes:" in out and "1  a finding matched --fail-on" in out and "--fail-on" in out


@pytest.mark.parametrize(
    "fail_on, expected",
    [(None, 0), ("graph-break", 1), ("recompile", 1), ("error", 1), ("graph-break,recompile", 1),
     ("recompile-limit", 1), ("fusion-blocked", 1)],
)
def test_fail_on_turns_findings_into_exit_code_1(fail_on, expected, capsys):
    argv = ["--from-json", DEMO_JSON, "--format", "json"] + (["--fail-on", fail_on] if fail_on else [])
    rc, out, err = run_main(argv, capsys)
    assert rc == expected
    assert Report.from_json(out) == common.bounded(demo_report())  # the report is still written
    if expected:
        assert "--fail-on" in err


def test_fail_on_passes_a_clean_report(tmp_path, capsys):
    clean = tmp_path / "clean.json"
    report = demo_report()
    report.graph_breaks, report.recompiles, report.errors = [], [], []
    clean.write_text(report.to_json())
    rc, _, _ = run_main(["--from-json", str(clean), "--fail-on", "graph-break,recompile,error", "-q"], capsys)
    assert rc == 0


@pytest.mark.parametrize("fmt, marker", [("terminal", "Summary: 3 graph breaks"), ("json", '"schema_version"'),
                                         ("md", "# fuselens report"), ("html", "<!DOCTYPE html>"),
                                         ("sarif", '"version": "2.1.0"')])
def test_output_option_writes_the_file_in_each_format(fmt, marker, tmp_path, capsys):
    target = tmp_path / f"report.{fmt}"
    rc, out, err = run_main(["--from-json", DEMO_JSON, "--format", fmt, "-o", str(target)], capsys)
    assert rc == 0 and out == ""
    text = target.read_text(encoding="utf-8")
    assert marker in text
    assert "\x1b[" not in text  # no colour codes in files
    assert f"wrote {target}" in err


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_end_to_end_report_of_a_real_program_in_a_subprocess(tmp_path):
    """`fuselens report` as a user runs it: a program with a graph break, a
    recompile from a new batch size, and a crash at the end."""
    _write(tmp_path / "prog.py", """\
        import sys
        import torch


        def f(x):
            y = x * 2
            print("step", sys.argv[1:])
            return y.sin()


        g = torch.compile(f)
        for n in (4, 7):
            g(torch.randn(n, 3))
        raise ValueError("boom at the end")
        """)
    out_json = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "fuselens", "report", "prog.py", "--backend", "eager", "--format", "json",
         "-o", str(out_json), "--timeout", "120", "--", "--epochs", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )
    # the program's crash is a finding, not a failure of the command
    assert proc.returncode == 0, proc.stderr
    report = Report.from_json(out_json.read_text())
    assert report.run.backend == "eager"
    assert [(os.path.basename(gb.location.file), gb.location.line) for gb in report.graph_breaks] == [("prog.py", 7)]
    assert report.graph_breaks[0].count == 2
    assert any(sc.input_name == "x" and sc.dim == 0 and (sc.old, sc.new) == ("4", "7")
               for rc in report.recompiles for sc in rc.shape_changes)
    assert [e.kind for e in report.errors] == ["exception"]
    assert report.errors[0].location.line == 14 and "boom at the end" in report.errors[0].message
    assert "--epochs" in report.run.stdout_tail  # program arguments after -- reached the program

    # the same report, gated in CI and rendered for people
    gate = subprocess.run([sys.executable, "-m", "fuselens", "report", "--from-json", str(out_json), "--fail-on",
                           "error", "--format", "sarif", "-o", str(tmp_path / "r.sarif")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert gate.returncode == 1
    sarif = json.loads((tmp_path / "r.sarif").read_text())
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in sarif["runs"][0]["results"]}
    assert uris == {"prog.py"}
    text = subprocess.run([sys.executable, "-m", "fuselens", "report", "--from-json", str(out_json)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60).stdout
    assert "prog.py:7: graph-break ×2" in text
    assert " 7 | print(\"step\", sys.argv[1:])" in text
