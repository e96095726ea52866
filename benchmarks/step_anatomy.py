"""Where one compiled step's wall time goes on the GPU: host enqueue, GPU kernels,
GPU idle, synchronizations, copies and the ATen calls made from the host.

    python -m benchmarks.step_anatomy --models gpt2,bert --modes infer,train --out DIR
    python -m benchmarks.step_anatomy --models llama --modes train --backends inductor_cg,fuselens_cg

Backends are `benchmarks.models`' labels (`inductor_cg` is `mode="reduce-overhead"`,
`fuselens_cg` our `cuda_graphs` option) or any registered backend's name.

For each model, mode and backend (same process, same inputs, as `benchmarks.models`):
- `enqueue_ms`: a call's host time with the GPU idle at its start (median of 30);
  `wall_ms`: the same call until the GPU is done. enqueue close to wall: host-bound.
- `back_to_back_ms`: steps queued back to back, as a training loop runs them (median of
  five blocks of 20); `full_gc_passes` / `full_gc_ms`: Python's full collections during
  these timed steps (each stalls a step);
- `allocations`: the caching allocator's allocations in one step (each costs host time);
- from torch.profiler over 5 steps: kernel ms and launches, GPU busy fraction (union
  of kernel intervals over the window), CUDA runtime API calls by name (a
  `cudaStreamSynchronize` or `cudaMemcpy` DtoH inside a step stalls the pipeline),
  memcpy/memset activity, and the host ATen ops by count (what a compiled graph
  still runs through ATen);
- `host_top`: cProfile over 20 calls, the Python functions with the most own time per
  call (where a replayed CUDA graph's host time goes: the GPU work is one launch).
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
from benchmarks.collections_timed import collections_timed  # noqa: E402
from benchmarks.models import back_to_back_s, backends_for, make_step, profiled_steps  # noqa: E402
from benchmarks.real_models import build  # noqa: E402


def enqueue_and_wall(step: Callable[[], Any], calls: int = 30) -> tuple[float, float]:
    enq, wall = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        enq.append(t1 - t0)
        wall.append(t2 - t0)
    return 1e3 * statistics.median(enq), 1e3 * statistics.median(wall)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def anatomy(step: Callable[[], Any], steps: int = 5) -> dict:
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        window_us = (time.perf_counter() - t0) * 1e6
    gpu: list[tuple[float, float]] = []
    kernels, copies, runtime, aten = {}, {}, {}, {}
    kernel_us = 0.0
    for e in prof.events():
        name = e.name
        if e.device_type == torch.autograd.DeviceType.CUDA:
            gpu.append((e.time_range.start, e.time_range.end))
            bucket = copies if name.startswith(("Memcpy", "Memset")) else kernels
            bucket[name] = bucket.get(name, 0) + 1
            kernel_us += e.device_time_total
        elif name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
            c = runtime.setdefault(name, [0, 0.0])
            c[0] += 1
            c[1] += e.cpu_time_total
        elif name.startswith("aten::"):
            aten[name] = aten.get(name, 0) + 1

    def per_step(d: dict, top: int = 25) -> dict:
        items = sorted(d.items(), key=lambda kv: -(kv[1][0] if isinstance(kv[1], list) else kv[1]))[:top]
        return {k: ([v[0] / steps, round(v[1] / steps / 1e3, 3)] if isinstance(v, list) else v / steps)
                for k, v in items}

    return {
        "kernel_ms": kernel_us / steps / 1e3,
        "launches": sum(kernels.values()) / steps,
        "gpu_busy": _union_us(gpu) / window_us,
        "runtime_calls_ms": per_step(runtime),
        "copies": per_step(copies),
        "kernels_by_count": per_step({k[:100]: v for k, v in kernels.items()}, 40),
        "aten_ops": per_step(aten, 40),
    }


def host_top(step: Callable[[], Any], calls: int = 20, top: int = 40) -> list[list]:
    import pstats

    prof = profiled_steps(step, calls, "cuda")
    rows = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:top]  # by own time
    return [[f"{Path(f).name}:{line} {fn}", round(nc / calls, 1), round(1e3 * tt / calls, 4)]
            for (f, line, fn), (_, nc, tt, _, _) in rows]


def _compile_kwargs(label: str) -> dict:
    known = dict(backends_for("cuda", True, [label]))
    if label == "eager" or label not in known:  # there "eager" means not compiled; here the backend
        return {"backend": label}
    return known[label]


def run(model: str, mode: str, backends: list[str]) -> list[dict]:
    train = mode == "train"
    case = build(model, "gpu")
    module = case.module.to("cuda")
    if not train:
        module = module.bfloat16()
    module.train(train)
    inputs = case.make_inputs("cuda")
    if model == "resnet50" and not train:
        inputs = {"x": inputs["x"].bfloat16()}
    out = []
    for backend in backends:
        torch._dynamo.reset()
        compiled = torch.compile(copy.deepcopy(module), **_compile_kwargs(backend))
        step = make_step(case, compiled, inputs, train, "cuda")
        for _ in range(3):
            step()
        with collections_timed() as passes:  # a full pass in the timed steps reads as a slow step
            enq, wall = enqueue_and_wall(step)
            # a training loop's throughput: the median of five blocks, as a rare stall is paid once
            loop_ms = 1e3 * statistics.median(back_to_back_s(step, 20, "cuda") for _ in range(5))
        full_gc_passes, full_gc_s = passes.get(2, (0, 0.0))
        torch.cuda.reset_peak_memory_stats()
        made = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
        step()
        peak = torch.cuda.max_memory_allocated() / 2**20
        # every tensor a step makes goes through the caching allocator: the generated wrapper's,
        # ATen's results and workspaces, Python's (a tensor taking over a dead one's memory does not)
        made = torch.cuda.memory_stats().get("allocation.all.allocated", 0) - made
        rec = {"model": model, "mode": mode, "backend": backend, "enqueue_ms": enq, "wall_ms": wall,
               "back_to_back_ms": loop_ms, "full_gc_passes": full_gc_passes, "full_gc_ms": 1e3 * full_gc_s,
               "peak_mb": peak, "allocations": made, **anatomy(step), "host_top": host_top(step)}
        print(json.dumps(rec), flush=True)
        out.append(rec)
        del compiled, step
        torch.cuda.empty_cache()
    return out


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--modes", default="infer")
    ap.add_argument("--backends", default="inductor,fuselens")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    results = []
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            results += run(model, mode, args.backends.split(","))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "step_anatomy.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
