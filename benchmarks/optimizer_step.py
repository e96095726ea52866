"""A compiled optimizer step on a real model's parameters: eager vs Inductor vs fuselens.

    python -m benchmarks.optimizer_step                         # GPU: GPT-2 and ResNet-50, AdamW
    python -m benchmarks.optimizer_step --models gpt2 --optimizers adamw,sgd --turns 50
    python -m benchmarks.optimizer_step --device cpu            # small configs

PyTorch's recipe compiles `opt.step` on its own (torch.compile of the step, the model
compiled apart or not). The parameters are the model's (benchmarks/real_models.py,
random weights), with random gradients; torch's optimizers on CUDA run their foreach
implementations, which Dynamo traces into `_foreach_*` ops. Each backend owns a copy
of the parameters, gradients and optimizer state; after all compiled, the backends
step in turns (wall ms and host ms a step, medians: a drifting host cannot skew one
backend alone), then the profiler counts each one's launches and GPU kernel ms a step.
The error column is the largest relative norm error of a parameter after the timed steps
against eager's parameters after as many steps (the same gradients).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_optimizer_bench_")

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402

fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.models import _sync, interleaved_times, profile_step, vs_inductor  # noqa: E402
from benchmarks.real_models import build  # noqa: E402

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.1),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-4),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
}
BACKENDS = {"eager": None, "inductor": {}, "fuselens": {"backend": "fuselens"},
            "fuselens_cg": {"backend": "fuselens", "options": {"cuda_graphs": True}},
            "inductor_cg": {"mode": "reduce-overhead"},
            # not in the default set: a kernel per parameter shape (compiler/combo_kernels.py off)
            "fuselens_no_combo": {"backend": "fuselens", "options": {"combo_kernels": False}},
            "fuselens_cg_no_combo": {"backend": "fuselens", "options": {"cuda_graphs": True, "combo_kernels": False}}}


def _parameters(model: str, device: str) -> list[torch.Tensor]:
    module = build(model, "gpu" if device == "cuda" else "cpu").module.to(device)
    g = torch.Generator(device=device).manual_seed(0)
    params = [torch.nn.Parameter(p.detach().clone()) for p in module.parameters()]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, device=device, dtype=p.dtype) * 1e-2
    return params


def run(model: str, opt_name: str, device: str, backends: list[str], turns: int, top: int = 0) -> dict:
    base = _parameters(model, device)
    rec: dict[str, Any] = {"model": model, "optimizer": opt_name, "params": len(base),
                           "numel": sum(p.numel() for p in base), "shapes": len({tuple(p.shape) for p in base})}
    steps: dict[str, Callable[[], Any]] = {}
    owned: dict[str, list[torch.Tensor]] = {}
    for label in backends:
        torch._dynamo.reset()
        params = copy.deepcopy(base)
        for p, q in zip(params, base):
            p.grad = q.grad.clone()
        opt = OPTIMIZERS[opt_name](params)
        kw = BACKENDS[label]
        step = opt.step if kw is None else torch.compile(opt.step, **kw)
        r: dict[str, Any] = {}
        rec[label] = r
        try:
            t0 = time.perf_counter()
            step()
            _sync(device)
            r["compile_s"] = round(time.perf_counter() - t0, 2)
            steps[label], owned[label] = step, params
        except Exception as e:  # noqa: BLE001 - one failing backend must not end the run
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    for label, (wall, host, _) in interleaved_times(steps, turns, device).items():
        rec[label]["wall_ms"], rec[label]["host_ms"] = round(wall, 4), round(host, 4)
    for label, step in steps.items():
        if device == "cuda":
            prof = profile_step(step, device, steps=5, top=top)
            rec[label]["launches"], rec[label]["kernel_ms"] = prof["launches"], round(prof["kernel_ms"], 4)
            if top:
                rec[label]["top"] = prof["top"]
    # every backend took the same number of steps with the same gradients: compare with eager's
    ref = owned.get("eager")
    if ref is not None:
        for label, params in owned.items():
            if label != "eager":
                rec[label]["err"] = max(float((p.detach() - q.detach()).double().norm()
                                              / q.detach().double().norm().clamp_min(1e-30)) for p, q in zip(params, ref))
    return rec


def table(results: list[dict], backends: list[str]) -> str:
    rows = ["| model | optimizer | backend | wall ms in turns | vs Inductor | host ms | kernel ms | launches | "
            "compile s | max err |", "|---" * 10 + "|"]
    for rec in results:
        for b in backends:
            r = rec.get(b, {})
            if "error" in r:
                rows.append(f"| {rec['model']} | {rec['optimizer']} | {b} | error: {r['error'][:80]} |")
                continue
            ratio = vs_inductor(rec, b, "wall_ms")
            vals = [r.get(c) for c in ("wall_ms", "host_ms", "kernel_ms", "launches", "compile_s", "err")]
            cells = ["-" if v is None else (f"{v:.1e}" if i == 5 else f"{v:.3g}") for i, v in enumerate(vals)]
            rows.append(f"| {rec['model']} | {rec['optimizer']} | {b} | {cells[0]} | {ratio} | " + " | ".join(cells[1:]) + " |")
    return "\n".join(rows)


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="gpt2,resnet50")
    ap.add_argument("--optimizers", default="adamw", help=f"comma-separated, of {','.join(OPTIMIZERS)}")
    ap.add_argument("--backends", default="", help=f"subset of {','.join(BACKENDS)} (default: all but the no_combo ones on the GPU, "
                    "eager,inductor,fuselens on the CPU)")
    ap.add_argument("--turns", type=int, default=30, help="rounds of one step per backend")
    ap.add_argument("--top", type=int, default=0, help="record each backend's top kernels in the JSON")
    ap.add_argument("--out", default="", help="write optimizer_bench.json here")
    args = ap.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b] or (
        [b for b in BACKENDS if "no_combo" not in b] if args.device == "cuda" else ["eager", "inductor", "fuselens"])
    if "eager" not in backends:
        backends.insert(0, "eager")
    info = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}
    results = []
    for m in [m for m in args.models.split(",") if m]:
        for o in [o for o in args.optimizers.split(",") if o]:
            results.append(run(m, o, args.device, backends, args.turns, args.top))
            print(json.dumps({k: v for k, v in results[-1].items() if not isinstance(v, dict) or "top" not in v}),
                  flush=True)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / "optimizer_bench.json").write_text(json.dumps({"info": info, "results": results},
                                                                              indent=1))
    print(json.dumps(info))
    print(table(results, backends))
    return 0


if __name__ == "__main__":
    sys.exit(main())
