"""Capture overhead of a distributed run: wall time of `fuselens report` on a
2-rank torchrun job against the plain `torchrun` run of the same program.

    python benchmarks/distributed_overhead.py [--runs 3] [--nproc 2] [-- PROGRAM_ARGS]

Prints a Markdown table (best and median of each, and the per-rank wall the
report measured inside each rank). CPU, gloo; the program is
tests/distributed/train_ddp.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "distributed", "train_ddp.py")


def _timed(cmd: list[str]) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall, proc.stdout


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    args = p.parse_args(argv[:cut])
    program_args = argv[cut + 1:] or ["--bucket-cap-mb", "1", "--width", "512", "--steps", "20"]
    plain_cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc), PROGRAM,
                 *program_args]
    plain, captured, rank_walls = [], [], []
    for _ in range(args.runs):
        plain.append(_timed(plain_cmd)[0])
        with tempfile.TemporaryDirectory() as run_dir:
            cmd = [sys.executable, "-m", "fuselens", "report", "-f", "json", "--run-dir", run_dir,
                   "--nproc-per-node", str(args.nproc), PROGRAM, "--", *program_args]
            wall, out = _timed(cmd)
            captured.append(wall)
            rank_walls.append(max(r["wall_s"] for r in json.loads(out)["ranks"]))
    rows = [
        ("plain torchrun (whole command)", plain),
        ("fuselens report (whole command)", captured),
        ("program wall inside the slowest captured rank", rank_walls),
    ]
    print(f"program: train_ddp.py {' '.join(program_args)}; {args.nproc} ranks, {args.runs} runs\n")
    print("| measure | best s | median s |\n|---|---|---|")
    for name, values in rows:
        print(f"| {name} | {min(values):.2f} | {statistics.median(values):.2f} |")
    print(f"| overhead of the report command (median) | | {statistics.median(captured) - statistics.median(plain):+.2f} |")


if __name__ == "__main__":
    main()
