"""Inductor's `reduce-overhead` and fuselens' `cuda_graphs` on one model in one process, the
way `benchmarks.models --cuda-graphs --turns` runs them: each compiled after a reset, then
both warmed again after one reset and stepped in turns. Prints each step as it returns.

    python -m benchmarks.cuda_graphs_two_backends [--model mixtral] [--mode train]

On the H200 with transformers 5.17 (thirty-seventh session), Mixtral training stepped clean
under each backend alone and in the first phase here, and failed in the turns: fuselens'
third step in turns raised "CUDA error: invalid argument" (its graphs were then Inductor's
fragments: Dynamo runs a frame eagerly under every backend once one backend's compile of
it failed), and the suite's own run of the same sequence aborted in the caching allocator
(`uc >= 0`, `releasePool`). Not yet attributed: this script is where to start.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.models import make_step  # noqa: E402
from benchmarks.real_models import build  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mixtral")
    ap.add_argument("--mode", default="train", choices=("train", "infer"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    train = args.mode == "train"
    case = build(args.model, "gpu")
    module = case.module.cuda().train(train)
    if not train:
        module = module.bfloat16()
    inputs = case.make_inputs("cuda")
    start = time.perf_counter()

    def log(*what: object) -> None:
        print(f"{time.perf_counter() - start:7.1f}s", *what, flush=True)

    backends = {"inductor": dict(backend="inductor", mode="reduce-overhead"),
                "fuselens": dict(backend="fuselens", options={"cuda_graphs": True})}
    steps = {}
    for name, kw in backends.items():
        torch._dynamo.reset()
        steps[name] = make_step(case, torch.compile(module, **kw), inputs, train, "cuda")
        for k in range(3):
            steps[name]()
            torch.cuda.synchronize()
            log(name, "own step", k)
    torch._dynamo.reset()
    log("reset")
    for name, step in steps.items():
        for k in range(3):
            step()
            torch.cuda.synchronize()
            log(name, "warmed again, step", k)
    for r in range(args.rounds):
        for name, step in steps.items():
            step()
            torch.cuda.synchronize()
            log(name, "turn", r)
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
