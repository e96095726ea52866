"""What `fuselens report` costs over running the program (issue 18: on a warm
cache at most 1.2x the plain run).

    python benchmarks/report_overhead.py [--runs 3] [PROGRAM ...]

For each program, in subprocesses, all with one fresh FUSELENS_CACHE_DIR:
one untimed plain run (warms the compile caches, as a user's earlier runs
would), then timed: the first `fuselens report` (fix verdicts not cached
yet: each editable fix re-runs the program), then --runs rounds of a plain
run `python PROGRAM` and a warm report (verdicts from the cache),
interleaved. Prints a Markdown table of wall and CPU times (best of the
rounds) and the ratios to the plain run; the report is the default one
(kernels timed) written as JSON to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = [
    "examples/demo.py",
    "tests/corpus/real/intermediate_shape.py",
    "tests/corpus/real/nonzero_route.py",
    "tests/corpus/real/dtype_switch.py",
]


def _timed(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(wall s, CPU s of the command and its children): on a shared machine the
    CPU time moves less with other people's load than the wall time does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@dataclass
class Measured:
    program: str
    plain: tuple[float, float]  # best (wall, CPU) of the plain runs
    cold: tuple[float, float]  # the first report: no stored verdicts
    warm: tuple[float, float]  # best of the later reports
    verdicts: str  # RunInfo.fix_verdicts of the first and of the last report


def measure(program: str, runs: int) -> Measured:
    path = os.path.join(ROOT, program)
    cwd = os.path.dirname(path)
    with tempfile.TemporaryDirectory(prefix="fuselens-overhead-") as cache:
        env = dict(os.environ, FUSELENS_CACHE_DIR=os.path.join(cache, "c"),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        plain_cmd = [sys.executable, path]
        out = os.path.join(cache, "report.json")
        report_cmd = [sys.executable, "-m", "fuselens", "report", path, "-q", "-f", "json", "-o", out]
        _timed(plain_cmd, env, cwd)  # warm-up: compile caches as a user's earlier runs leave them
        cold = _timed(report_cmd, env, cwd)  # the only report without stored verdicts
        first = _verdicts(out)
        plain, warm = [], []
        for _ in range(runs):  # interleaved, so that a burst of load hits both alike
            plain.append(_timed(plain_cmd, env, cwd))
            warm.append(_timed(report_cmd, env, cwd))
        return Measured(program, min(plain), cold, min(warm), f"{first} -> {_verdicts(out)}")


def _verdicts(report_json: str) -> str:
    with open(report_json, encoding="utf-8") as f:
        return json.load(f)["run"].get("fix_verdicts", "") or "none"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("programs", nargs="*", default=PROGRAMS, help="paths relative to the repository root")
    p.add_argument("--runs", type=int, default=3, help="rounds of a plain run and a warm report (best is kept)")
    args = p.parse_args()
    print("| program | plain s (CPU s) | first report s (ratio) | warm report s (CPU s) | warm ratio wall (CPU) "
          "| verdicts |")
    print("|---|---|---|---|---|---|")
    for program in args.programs:
        m = measure(program, args.runs)
        (pw, pc), (cw, _), (ww, wc) = m.plain, m.cold, m.warm
        print(f"| {program} | {pw:.2f} ({pc:.2f}) | {cw:.2f} ({cw / pw:.2f}x) | {ww:.2f} ({wc:.2f}) "
              f"| {ww / pw:.2f}x ({wc / pc:.2f}x) | {m.verdicts} |", flush=True)

if __name__ == "__main__":
    main()
