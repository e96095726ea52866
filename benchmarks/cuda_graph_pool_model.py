"""A CUDA-graph pool's allocations, recorded on the GPU and replayed through a model of the
caching allocator, to see what a change to the allocation pattern does to the pool's
reservation before spending device time on it.

    python -m benchmarks.cuda_graph_pool_model record --models resnet50 --out DIR   # GPU
    python -m benchmarks.cuda_graph_pool_model replay DIR/pool_resnet50_fuselens_cg.json.gz \
        --reserve-mb 0,1200,1324                                                       # anywhere

`record` runs four training steps (`--mode infer`: inference calls) of a suite model under a CUDA-graph backend with the
allocator's history on (a process per model), and keeps the graphs' private pools: their segments and every
allocation and free in them. `replay` feeds those allocations, in order, to the model below
and prints its segments and reserved MB, without and with one segment of each
`--reserve-mb` reserved before the first allocation. A trace that begins with such a
reservation (an allocation freed before anything else) replays without it.

The model is the caching allocator's rules for one pool on one stream (c10's
CUDACachingAllocator, torch 2.11-2.13, no `max_split_size`, no expandable segments):
requests up to 1 MiB take 2 MiB segments of a small pool of their own; a larger request
takes the smallest free block that fits, split when more than 1 MiB is left, else a new
segment of its size (20 MiB under 10 MiB, else rounded up to 2 MiB); a freed block merges
with free neighbours of its segment. On ResNet-50's recorded steps it gives the recorded
76 segments and 1574 MB exactly; BERT's and GPT-2's within 1% of theirs.

What it showed (thirty-first session, benchmarks/RESULTS.md): one segment of the forward's
planned peak, reserved before its warm-up, takes ResNet-50's pool from 1574 to 1366 MB and
GPT-2's from 2632 to 2256, but BERT's from 2188 to 2440, and small changes to the
reservation move each by 10-20% either way. So the runtime reserves only where this model,
run on the graph's own plan, predicts a gain (compiler/runtime/pool_reserve.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

from fuselens.compiler.runtime.allocator_model import MB, replay


def load(path: Path) -> tuple[list[tuple[str, int, int]], dict]:
    """The private pool's allocations and frees of a recorded trace, without a reservation
    made first (an allocation freed before anything else was allocated); and its summary."""
    d = json.load(gzip.open(path, "rt"))
    spans = [(s["addr"], s["addr"] + s["size"]) for s in d["segments"] if tuple(s["pool"]) != (0, 0)]
    events = [(a, addr, size) for a, addr, size, *_ in d["trace"]
              if a in ("alloc", "free_requested") and any(lo <= addr < hi for lo, hi in spans)]
    if len(events) >= 2 and events[0][0] == "alloc" and events[1] == ("free_requested", events[0][1], events[0][2]):
        events = events[2:]
    summary = {"segments": len(spans), "reserved_mb": sum(hi - lo for lo, hi in spans) / MB}
    return events, summary


def record(model: str, backend: str, out: Path, train: bool = True) -> Path:
    import torch

    import fuselens.compiler
    from benchmarks.models import backends_for, make_step, placed
    from benchmarks.real_models import build

    fuselens.compiler.register()
    case = build(model, "gpu")
    module, inputs = placed(case, train, "cuda")  # inference in bf16, as the suite runs it
    kw = dict(backends_for("cuda", True, [backend]))[backend]
    step = make_step(case, torch.compile(module, **kw), inputs, train, "cuda")
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    for _ in range(4):
        step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    segs = [{"pool": list(s.get("segment_pool_id", (0, 0))), "addr": s["address"], "size": s["total_size"]}
            for s in snap["segments"]]
    trace = [[e["action"], e["addr"], e["size"]] for dev in snap["device_traces"] for e in dev]
    path = out / f"pool_{model}_{backend}{'' if train else '_infer'}.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"segments": segs, "trace": trace}, f)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="GPU: record suite models' CUDA-graph pools")
    rec.add_argument("--models", default="resnet50")
    rec.add_argument("--backend", default="fuselens_cg")
    rec.add_argument("--mode", choices=("train", "infer"), default="train")
    rec.add_argument("--out", type=Path, default=Path("."))
    rep = sub.add_parser("replay", help="replay recorded pools through the allocator's model")
    rep.add_argument("traces", nargs="+", type=Path)
    rep.add_argument("--reserve-mb", default="0", help="comma-separated reservations to try (0: none)")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        args.out.mkdir(parents=True, exist_ok=True)
        models = args.models.split(",")
        if len(models) == 1:
            print(record(models[0], args.backend, args.out, args.mode == "train"), flush=True)
            return 0
        for m in models:  # a process each: a snapshot holds every pool of its process
            subprocess.run([sys.executable, "-m", "benchmarks.cuda_graph_pool_model", "record", "--models", m,
                            "--backend", args.backend, "--mode", args.mode, "--out", str(args.out)], check=True)
        return 0
    for path in args.traces:
        events, summary = load(path)
        print(f"{path.name}: the run's private pools held {summary['segments']} segments, "
              f"{summary['reserved_mb']:.0f} MB")
        for r in (int(x) for x in args.reserve_mb.split(",")):
            pool = replay(events, r * MB)
            print(f"  reserve {r:>5} MB: model {len(pool.segments):>3} segments, {pool.reserved_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
