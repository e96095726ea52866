"""What is alive at a step's peak GPU memory, for each backend (CUDA only).

    python -m benchmarks.memory_peak --models resnet50 --modes infer
    python -m benchmarks.memory_peak --models bert,resnet50 --modes train --out DIR

Each backend compiles and runs the step of `benchmarks.models` (same models, same
inputs) twice, then one more step runs under the CUDA allocator's history
(`torch.cuda.memory._record_memory_history`). Replaying that history gives the
moment of the step's peak and every allocation alive then; they are grouped by the
innermost Python frame that is not torch's own (a line of a generated wrapper, a
model's forward), largest first. The rest of the peak is what was alive before
the step began: parameters, gradients, optimizer state. Two backends' peaks then
differ by named lines, not by a number.
"""

from __future__ import annotations

import argparse
import json
import linecache
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_memory_peak_")

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()
from benchmarks.models import make_step  # noqa: E402
from benchmarks.real_models import build  # noqa: E402

_LIBRARY = ("/torch/", "/site-packages/torch", "/contextlib.py", "/functools.py", "/benchmarks/memory_peak.py")


def _where(frames: list[dict]) -> str:
    """The innermost frame that is not torch's own or this script's (innermost first)."""
    for f in frames:
        name = f.get("filename", "")
        if name and not any(part in name for part in _LIBRARY) and not name.startswith("??"):
            text = linecache.getline(name, int(f.get("line") or 0)).strip()  # generated wrappers are in linecache
            return f"{Path(name).name}:{f.get('line')} {f.get('name')}: {text[:160]}"
    return "(torch internals)"


def live_at_peak(trace: list[dict], before: int) -> tuple[int, list[dict]]:
    """(peak bytes above what was alive before the step, the allocations alive then, grouped)."""
    live: dict[int, tuple[int, str]] = {}
    cur = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for ev in trace:
        action, addr, size = ev.get("action"), ev.get("addr"), ev.get("size", 0)
        if action == "alloc":
            live[addr] = (size, _where(ev.get("frames", [])))
            cur += size
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif action in ("free_requested", "free") and addr in live:
            cur -= live.pop(addr)[0]
    groups: dict[str, list[int]] = {}
    for size, where in at_peak.values():
        g = groups.setdefault(where, [0, 0])
        g[0] += size
        g[1] += 1
    rows = [{"where": w, "mb": round(b / 2**20, 1), "count": n} for w, (b, n) in groups.items()]
    rows.sort(key=lambda r: -r["mb"])
    return before + peak, rows


def measure(name: str, mode: str, backend: str) -> dict:
    train = mode == "train"
    case = build(name, "gpu")
    module = case.module.to("cuda").train(train)
    if not train:
        module = module.bfloat16()
    inputs = case.make_inputs("cuda")
    if not train:  # images in the model's dtype, as benchmarks.models runs them
        inputs = {k: v.bfloat16() if v.is_floating_point() else v for k, v in inputs.items()}
    torch._dynamo.reset()
    for k in [k for k in linecache.cache if k.startswith("<fuselens-wrapper")]:
        del linecache.cache[k]  # the wrappers of this measurement only, in the JSON
    kw: dict[str, Any] = {"backend": "fuselens"} if backend == "fuselens" else {}
    compiled = module if backend == "eager" else torch.compile(module, **kw)
    step = make_step(case, compiled, inputs, train, "cuda")
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=200000)
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][torch.cuda.current_device()]
    peak, rows = live_at_peak(trace, before)
    wrappers = {k: "".join(v[2]) for k, v in linecache.cache.items() if k.startswith("<fuselens-wrapper")}
    return {"model": name, "mode": mode, "backend": backend, "peak_mb": round(peak / 2**20, 1), "wrappers": wrappers,
            "allocator_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "before_step_mb": round(before / 2**20, 1), "live_at_peak": rows[:25]}


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--modes", default="infer")
    ap.add_argument("--backends", default="inductor,fuselens")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    results = []
    for m in a.models.split(","):
        for mode in a.modes.split(","):
            for b in a.backends.split(","):
                try:
                    r = measure(m, mode, b)
                except Exception as e:  # noqa: BLE001 - one failing backend must not end the run
                    r = {"model": m, "mode": mode, "backend": b, "error": f"{type(e).__name__}: {e}"[:400]}
                results.append(r)
                print(f"\n{m} {mode} {b}: peak {r.get('peak_mb')} MB (allocator {r.get('allocator_peak_mb')}, "
                      f"alive before the step {r.get('before_step_mb')}) {r.get('error', '')}", flush=True)
                for row in r.get("live_at_peak", [])[:15]:
                    print(f"  {row['mb']:9.1f} MB {row['count']:4d}x  {row['where']}", flush=True)
                torch.cuda.empty_cache()
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "memory_peak.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
