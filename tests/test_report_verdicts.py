"""Fix verdicts are cached by content (issue 18: a warm `fuselens report` takes
at most 1.2x the plain run): a second report of an unchanged program takes
every verdict from the private cache and runs the program once; editing the
program, a Python file it imports, or passing `--cold` re-runs the fixes."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from fuselens.report.verdicts import RunContext, Verdict, VerdictStore, local_files_digest, verdict_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each run of this program (the report's own, and each verification run of a
# copy beside it) appends one line to runs.log: the log counts executions.
PROGRAM = textwrap.dedent('''\
    import os
    import torch

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.log"), "a") as log:
        log.write("run\\n")


    @torch.compile(backend="eager")
    def double(x):
        return x * 2


    for n in (4, 6):
        double(torch.randn(n))
    ''')


def _report(folder: str, cache: str, *extra: str) -> dict:
    out = os.path.join(folder, "r.json")
    env = dict(os.environ, PYTHONPATH=ROOT, FUSELENS_CACHE_DIR=cache)
    proc = subprocess.run([sys.executable, "-m", "fuselens", "report", "prog.py", "-q", "-f", "json", "-o", out,
                           "--no-time-kernels", *extra], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def _runs(folder: str) -> int:
    with open(os.path.join(folder, "runs.log"), encoding="utf-8") as f:
        return len(f.read().splitlines())


def _verdicts(report: dict) -> list[tuple]:
    return [(f["title"], f["verified"], f["preferred"]) for rc in report["recompiles"] for f in rc["fixes"]]


@pytest.mark.slow
def test_a_warm_report_takes_verdicts_from_the_cache_and_runs_the_program_once(tmp_path):
    folder, cache = str(tmp_path / "work"), str(tmp_path / "cache")
    os.mkdir(folder)
    with open(os.path.join(folder, "prog.py"), "w", encoding="utf-8") as f:
        f.write(PROGRAM)

    first = _report(folder, cache)
    cold_runs = _runs(folder)
    assert first["run"]["fix_verdicts"] == "re-run" and cold_runs >= 2  # the program, then at least one fix

    second = _report(folder, cache)
    assert _runs(folder) == cold_runs + 1  # only the program itself: no fix was re-run
    assert second["run"]["fix_verdicts"] == "cached"
    assert _verdicts(second) == _verdicts(first) and any(v for _, v, _ in _verdicts(second))

    folder_mode = stat.S_IMODE(os.stat(os.path.join(cache, "fix-verdicts")).st_mode)
    assert folder_mode == 0o700
    for name in os.listdir(os.path.join(cache, "fix-verdicts")):
        assert stat.S_IMODE(os.stat(os.path.join(cache, "fix-verdicts", name)).st_mode) == 0o600

    with open(os.path.join(folder, "prog.py"), "a", encoding="utf-8") as f:
        f.write("# edited\n")
    before = _runs(folder)
    third = _report(folder, cache)
    assert third["run"]["fix_verdicts"] == "re-run" and _runs(folder) == before + cold_runs  # the edit invalidated every verdict

    before = _runs(folder)
    fourth = _report(folder, cache, "--cold")
    assert fourth["run"]["fix_verdicts"] == "re-run" and _runs(folder) == before + cold_runs


def _context(script: str, **changes) -> RunContext:
    base = dict(script=script, args=["--n", "4"], cwd=os.path.dirname(script), options={"backend": None},
                torch_version="2.13.0", python_version="3.11.7", environ={"PATH": "/bin"})
    base.update(changes)
    return RunContext.of(base.pop("script"), **base)


def test_the_verdict_key_changes_with_the_program_an_imported_file_the_args_options_and_versions(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import helpers\nimport torch\n")
    (tmp_path / "helpers.py").write_text("SIZE = 4\n")
    target = ("recompile", "step", "input-size")
    key = verdict_key(_context(str(script)), script.read_text(), target)
    assert key == verdict_key(_context(str(script)), script.read_text(), target)  # stable
    assert key != verdict_key(_context(str(script)), script.read_text() + "# edited\n", target)
    assert key != verdict_key(_context(str(script)), script.read_text(), ("recompile", "step", "dtype"))
    for change in ({"args": ["--n", "8"]}, {"options": {"backend": "inductor"}}, {"torch_version": "2.11.0"},
                   {"environ": {"PATH": "/bin", "TORCH_LOGS": "+dynamo"}}):
        assert key != verdict_key(_context(str(script), **change), script.read_text(), target), change
    other_fuselens = dataclasses.replace(_context(str(script)), fuselens_version="0.2.0+0123")
    assert key != verdict_key(other_fuselens, script.read_text(), target)
    # The rest of the environment changes between shells: it is not part of the key.
    assert key == verdict_key(_context(str(script), environ={"PATH": "/usr/bin"}), script.read_text(), target)

    (tmp_path / "helpers.py").write_text("SIZE = 8\n")
    assert key != verdict_key(_context(str(script)), script.read_text(), target)


def test_local_files_digest_follows_imports_through_local_modules_and_packages(tmp_path):
    script = tmp_path / "main.py"
    script.write_text("from models import net\nimport os\n")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "net.py").write_text("import layers\n")
    (tmp_path / "layers.py").write_text("WIDTH = 4\n")
    (tmp_path / "unrelated.py").write_text("X = 1\n")
    before = local_files_digest(str(script))
    (tmp_path / "unrelated.py").write_text("X = 2\n")  # not imported: no change
    assert local_files_digest(str(script)) == before
    (tmp_path / "layers.py").write_text("WIDTH = 8\n")  # imported by an imported module
    assert local_files_digest(str(script)) != before


def test_verdict_store_keeps_its_folder_private_and_refuses_a_verdict_others_can_write(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSELENS_CACHE_DIR", str(tmp_path / "cache"))
    store = VerdictStore.open()
    assert stat.S_IMODE(os.stat(store.folder).st_mode) == 0o700
    store.put("k1", Verdict(True, "ran"))
    assert store.get("k1") == Verdict(True, "ran")
    os.chmod(os.path.join(store.folder, "k1.json"), 0o666)
    assert store.get("k1") is None and "other accounts can write it" in store.problems[-1]


def test_cold_store_reads_nothing_but_stores_fresh_verdicts(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSELENS_CACHE_DIR", str(tmp_path / "cache"))
    VerdictStore.open().put("k1", Verdict(False, "old"))
    cold = VerdictStore.open(refresh=True)
    assert cold.get("k1") is None
    cold.put("k1", Verdict(True, "new"))
    assert VerdictStore.open().get("k1") == Verdict(True, "new")


def test_a_report_whose_fixes_are_advice_only_runs_nothing(tmp_path):
    from fuselens.events import FixAdvice, GraphBreak, Report, RunInfo, SourceLocation
    from fuselens.report.verify import verify_report

    script = tmp_path / "p.py"
    script.write_text("x = 1\n")
    gb = GraphBreak(SourceLocation(str(script), 1, "f", "x = 1"), "Call to `torch._dynamo.graph_break()`",
                    fixes=[FixAdvice("optimizer-step", "move optimizer.step() out of the compiled function")])
    report = Report(run=RunInfo(target=str(script)), graph_breaks=[gb])

    def run(path: str) -> Report:
        raise AssertionError(f"an advice-only fix was run: {path}")

    done = verify_report(report, str(script), run)
    assert (done.runs, done.cached, done.describe()) == (0, 0, "")
    assert gb.fixes[0].verified is None and not gb.fixes[0].preferred
