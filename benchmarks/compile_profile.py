"""Where a cold compile's seconds go: one compiled step's first call under cProfile.

    python -m benchmarks.compile_profile --models gpt2,resnet50 --modes train --out DIR

For each model and mode (the suite's models and steps, `benchmarks.models`), a
fresh `torch._dynamo.reset()` and the backend's first call, timed and profiled:
- the wall seconds of that call, torch's compile timers and fuselens' phases
  (`PhaseTime`: graph passes, lowering, scheduling, code generation, Triton
  compiles and the first call's wait for the compile workers);
- Python's garbage collections during that call, by generation (passes, seconds), and
  each pass of an older generation with where it began (`older_gc_passes`);
- the functions with the most cumulative and own time (cProfile; it slows Python
  code about 1.5x, so the shares matter, not the seconds), and the `.prof` file
  for `pstats`;
- with `--no-profile`, the first call's seconds as a user sees them, no cProfile;
- for fuselens, when each compile worker became ready, counted from its start,
  and when the pool started, counted from the call's start (a worker that is not
  ready when a graph's kernels are generated leaves them to this process).
The first model of a run also pays the process's first compile (imports, the
compile workers' start), as it does in `benchmarks.models`.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_compile_profile_")

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.collections_timed import collections_timed  # noqa: E402
from benchmarks.models import compile_phases, make_step, placed  # noqa: E402
from benchmarks.real_models import MODELS, VISION, build  # noqa: E402


def _stats_text(prof: cProfile.Profile, key: str, top: int) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(key).print_stats(top)
    return s.getvalue()


def profile_compile(name: str, mode: str, backend: str, device: str, top: int, out: Path | None,
                    profile: bool = True) -> dict:
    from fuselens import sink
    from fuselens.compiler.runtime import compile_pool
    from fuselens.events import PhaseTime

    train = mode == "train"
    torch._dynamo.reset()
    case = build(name, "gpu" if device == "cuda" else "cpu")
    module, inputs = placed(case, train, device)
    step = make_step(case, torch.compile(module, backend=backend), inputs, train, device)
    torch._dynamo.utils.compilation_time_metrics.clear()
    prof = cProfile.Profile()
    older: list = []
    with sink.collect() as events, collections_timed(older) as collections:
        t0 = time.perf_counter()
        if profile:
            prof.enable()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        if profile:
            prof.disable()
        wall = time.perf_counter() - t0
    phases: dict[str, float] = {}
    for e in events:
        if isinstance(e, PhaseTime):
            phases[e.phase] = round(phases.get(e.phase, 0.0) + e.seconds, 3)
    rec: dict[str, Any] = {"model": name, "mode": mode, "backend": backend, "first_call_s": round(wall, 3),
                           "torch_phases": compile_phases(), "fuselens_phases": phases,
                           "gc": {f"gen{g}": {"passes": n, "s": round(t, 3)} for g, (n, t) in sorted(collections.items())},
                           "older_gc_passes": [dataclasses.asdict(p) for p in older]}
    pool = compile_pool.get_pool(0)
    if pool is not None:
        ready = [getattr(w, "ready_after_s", None) for w in pool.workers]  # None: not ready (or older code)
        rec["workers_ready_after_s"] = [None if r is None else round(r, 2) for r in ready]
        started = [getattr(w, "started", None) for w in pool.workers]
        if None not in started:
            rec["pool_started_at_s"] = round(min(started) - t0, 2)
    print(f"== {name} {mode} {backend}: first call {wall:.2f} s", json.dumps(rec), sep="\n", flush=True)
    if not profile:
        return rec
    print(_stats_text(prof, "cumulative", top), _stats_text(prof, "tottime", top), sep="\n", flush=True)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        prof.dump_stats(str(out / f"{name}_{mode}_{backend}.prof"))
    return rec


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--modes", default="train")
    ap.add_argument("--backend", default="fuselens")
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--no-profile", action="store_true",
                    help="time the first call without cProfile (seconds as a user sees them)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else None
    info = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}
    results = []
    for name in [m for m in args.models.split(",") if m]:
        try:
            __import__("torchvision" if name in VISION else "transformers")
        except ImportError as e:
            print(f"skip {name}: {e}", flush=True)
            continue
        for mode in [m for m in args.modes.split(",") if m]:
            results.append(profile_compile(name, mode, args.backend, args.device, args.top, out,
                                           not args.no_profile))
            if out is not None:
                out.mkdir(parents=True, exist_ok=True)
                (out / "compile_profile.json").write_text(json.dumps({"info": info, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
