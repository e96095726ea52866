"""Training steps with CUDA graphs when a process holds more than one compiled model (CUDA only).

    python -m benchmarks.cuda_graph_copies --models llama,resnet50 --copies 2 --out DIR

A GAN's generator and discriminator, a teacher and its student, or a model compiled
twice: each has CUDA graphs of its own in one process. Here one model of
`benchmarks.models` is compiled once with `mode="reduce-overhead"` and `--copies` times
with fuselens' `cuda_graphs` (each copy its own deep copy of the module, same inputs),
and every compiled step is timed in turns (`--rounds` rounds of `--steps` steps back
to back, then a synchronize), as a training loop runs them: the median ms per step,
and the host ms of one step with the GPU idle at its start. With `--copies 1` it is
the suite's comparison, timed back to back.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.models import backends_for, make_step  # noqa: E402
from benchmarks.real_models import build  # noqa: E402


def _back_to_back_ms(step: Callable[[], Any], steps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def _enqueue_ms(step: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3


def run(model: str, copies: int, rounds: int, steps: int) -> dict:
    torch._dynamo.reset()
    case = build(model, "gpu")
    module = case.module.to("cuda").train(True)
    inputs = case.make_inputs("cuda")
    kinds = dict(backends_for("cuda", True, ["inductor_cg", "fuselens_cg"]))
    labels = ["inductor_cg"] + [f"fuselens_cg#{i}" for i in range(copies)]
    compiled: dict[str, Callable[[], Any]] = {}
    for label in labels:
        kw = kinds[label.split("#")[0]]
        compiled[label] = make_step(case, torch.compile(copy.deepcopy(module), **kw), inputs, True, "cuda")
        for _ in range(4):  # warm-up, capture, replays
            compiled[label]()
    wall: dict[str, list[float]] = {k: [] for k in compiled}
    host: dict[str, list[float]] = {k: [] for k in compiled}
    for _ in range(rounds):
        for k, step in compiled.items():
            wall[k].append(_back_to_back_ms(step, steps))
            host[k].append(_enqueue_ms(step))
    rec = {"model": model, "copies": copies,
           **{k: {"ms": statistics.median(wall[k]), "host_ms": statistics.median(host[k])} for k in compiled}}
    base = rec["inductor_cg"]["ms"]
    for k in labels[1:]:
        rec[k]["vs_reduce_overhead"] = base / rec[k]["ms"]
    return rec


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama")
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("CUDA only: CUDA graphs need a GPU", file=sys.stderr)
        return 2
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    results = []
    for model in args.models.split(","):
        rec = run(model, args.copies, args.rounds, args.steps)
        print(json.dumps(rec), flush=True)
        results.append(rec)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cuda_graph_copies.json").write_text(json.dumps({"info": info, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
