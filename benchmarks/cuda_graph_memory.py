"""Where the memory of CUDA graphs goes, for Inductor's `reduce-overhead` and fuselens'
`cuda_graphs` (CUDA only).

    python -m benchmarks.cuda_graph_memory --models gpt2,bert --modes train --out DIR

Each backend compiles the step of `benchmarks.models` (same models, same inputs) and
runs it three times more, as the suite does before it times. Then, with the step's
last result still held:
- reserved and allocated MB over what was there before the compile;
- what `torch.cuda.empty_cache()` gives back (`freeable_mb`): memory no tensor holds,
  the pools of graphs captured again among it; and what stays reserved then, counted
  from the memory live before the compile (`reserved_mb_after_empty_cache`: the suite's
  reserved MB, which the general pool's fragmentation left by an earlier backend does
  not move);
- each memory pool the allocator holds (CUDA graphs' private pools and the general
  one): its MB reserved and MB allocated in it (outputs a graph keeps between replays);
- for fuselens, each graph: captures made, signatures alive, its pool, its outputs' MB,
  and the inputs its replays copy into static buffers (MB held twice); in training, how
  many parameter gradients the last step left on the graphs' memory (the rest autograd
  cloned: their MB).
With `--bench`, the same again after `benchmarks.models.time_step` (do_bench's few
hundred steps, as the suite times): what a long run adds (graphs captured again).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_cg_memory_")

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()
from benchmarks.models import make_step, time_step  # noqa: E402
from benchmarks.cuda_graph_pools import MB, fuselens_graphs, gradients_in_graph_memory, pools  # noqa: E402
from benchmarks.real_models import MODELS, build  # noqa: E402

BACKENDS = {"inductor_cg": {"mode": "reduce-overhead"},
            "fuselens_cg": {"backend": "fuselens", "options": {"cuda_graphs": True}}}


def held(reserved0: int, allocated0: int, label: str) -> dict:
    """What the backend holds now, over what was there before its compile."""
    torch.cuda.synchronize()
    r: dict[str, Any] = {"reserved_mb": (torch.cuda.memory_reserved() - reserved0) / MB,
                         "allocated_mb": (torch.cuda.memory_allocated() - allocated0) / MB, "pools": pools()}
    if label == "fuselens_cg":
        r["graphs"] = fuselens_graphs()
    return r


def measure(name: str, mode: str, backends: list[str], bench: bool) -> dict:
    train = mode == "train"
    rec: dict[str, Any] = {"model": name, "mode": mode}
    for label in backends:
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
        case = build(name, "gpu")
        module = case.module.cuda()
        if not train:
            module = module.bfloat16()
        module.train(train)
        inputs = case.make_inputs("cuda")
        torch.cuda.synchronize()
        reserved0, allocated0 = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
        step = make_step(case, torch.compile(module, **BACKENDS[label]), inputs, train, "cuda")
        out = None
        for _ in range(4):
            out = step()
        r = held(reserved0, allocated0, label)
        if label == "fuselens_cg" and train:
            r["gradients"] = gradients_in_graph_memory(module)
        if bench:
            time_step(step, "cuda", 0)
            r["after_bench"] = held(reserved0, allocated0, label)
        gc.collect()
        torch.cuda.empty_cache()
        r["freeable_mb"] = r["reserved_mb"] - (torch.cuda.memory_reserved() - reserved0) / MB
        r["reserved_mb_after_empty_cache"] = (torch.cuda.memory_reserved() - allocated0) / MB
        r["pools_after_empty_cache"] = pools()
        rec[label] = r
        print(json.dumps({"model": name, "mode": mode, "backend": label,
                          **{k: v for k, v in r.items() if not k.startswith("pools") and k != "after_bench"}}),
              flush=True)
        if bench:
            print(json.dumps({"after_bench": {k: v for k, v in r["after_bench"].items() if k != "pools"}}), flush=True)
        del out, step, module, case, inputs
    torch._dynamo.reset()
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--modes", default="train")
    ap.add_argument("--backends", default="inductor_cg,fuselens_cg")
    ap.add_argument("--bench", action="store_true", help="also measure after do_bench's steps")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    results = [measure(m, mode, a.backends.split(","), a.bench)
               for m in a.models.split(",") for mode in a.modes.split(",")]
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "cuda_graph_memory.json").write_text(json.dumps({"info": info, "results": results}, indent=1))
    for rec in results:
        for label in a.backends.split(","):
            r = rec.get(label, {})
            print(f"{rec['model']} {rec['mode']} {label}: reserved {r.get('reserved_mb', 0):.0f} MB, "
                  f"allocated {r.get('allocated_mb', 0):.0f}, freeable {r.get('freeable_mb', 0):.0f}; pools "
                  + ", ".join(f"{p['reserved_mb']:.0f}/{p['allocated_mb']:.0f}" for p in r.get("pools", [])))
            b = r.get("after_bench")
            if b:
                print(f"  after do_bench: reserved {b['reserved_mb']:.0f} MB, allocated {b['allocated_mb']:.0f}; pools "
                      + ", ".join(f"{p['reserved_mb']:.0f}/{p['allocated_mb']:.0f}" for p in b["pools"]))


if __name__ == "__main__":
    main()
