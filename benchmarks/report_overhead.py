"""What `fuselens report` costs over running the program (issue 18: on a warm
cache at most 1.2x the plain run).

    python benchmarks/report_overhead.py [--runs 1] [PROGRAM ...]

For each program, in subprocesses, all with one fresh FUSELENS_CACHE_DIR:
one untimed plain run (warms the compile caches, as a user's earlier runs
would), then timed: the plain run `python PROGRAM`, the first
`fuselens report` (fix verdicts not cached yet: each editable fix re-runs the
program) and a second one (verdicts from the cache). Prints a Markdown table
of wall times (best of --runs) and the ratios to the plain run; the report
is the default one (terminal format written to a file, kernels timed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = [
    "examples/demo.py",
    "tests/corpus/real/intermediate_shape.py",
    "tests/corpus/real/nonzero_route.py",
    "tests/corpus/real/dtype_switch.py",
]


def _timed(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall


def measure(program: str, runs: int) -> dict[str, object]:
    path = os.path.join(ROOT, program)
    cwd = os.path.dirname(path)
    with tempfile.TemporaryDirectory(prefix="fuselens-overhead-") as cache:
        env = dict(os.environ, FUSELENS_CACHE_DIR=os.path.join(cache, "c"),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        plain_cmd = [sys.executable, path]
        out = os.path.join(cache, "report.json")
        report_cmd = [sys.executable, "-m", "fuselens", "report", path, "-q", "-f", "json", "-o", out]
        _timed(plain_cmd, env, cwd)  # warm-up: compile caches as a user's earlier runs leave them
        plain = min(_timed(plain_cmd, env, cwd) for _ in range(runs))
        cold = _timed(report_cmd, env, cwd)  # the only report without stored verdicts
        with open(out, encoding="utf-8") as f:
            first = json.load(f)["run"].get("fix_verdicts", "")
        warm = min(_timed(report_cmd, env, cwd) for _ in range(runs))
        with open(out, encoding="utf-8") as f:
            second = json.load(f)["run"].get("fix_verdicts", "")
    return {"program": program, "plain": plain, "cold": cold, "warm": warm, "first": first or "none",
            "second": second or "none"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("programs", nargs="*", default=PROGRAMS, help="paths relative to the repository root")
    p.add_argument("--runs", type=int, default=1, help="timed plain runs and warm reports (best is kept)")
    args = p.parse_args()
    print("| program | plain s | report, verdicts not cached s (ratio) | report, warm s (ratio) | verdicts |")
    print("|---|---|---|---|---|")
    for program in args.programs:
        r = measure(program, args.runs)
        plain = float(r["plain"])  # type: ignore[arg-type]
        cold, warm = float(r["cold"]), float(r["warm"])  # type: ignore[arg-type]
        print(f"| {program} | {plain:.2f} | {cold:.2f} ({cold / plain:.2f}x) | {warm:.2f} ({warm / plain:.2f}x) "
              f"| {r['first']} -> {r['second']} |", flush=True)


if __name__ == "__main__":
    main()
