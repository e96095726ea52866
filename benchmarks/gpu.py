"""GPU benchmark: eager vs Inductor vs fuselens (Triton target), one process.

    python -m benchmarks.gpu [--out DIR] [--cases a,b] [--variants autotune,cuda_graphs]
                             [--configure compile_workers=-1]

Cases (issue 5): sin(x)^2+cos(x)^2 on 64M fp32, softmax fp32 8192x8192 and bf16
32768x1024, layernorm fp32 16384x4096, gelu(x+b) bf16 16384x4096, a GPT-2 block
(bf16, batch 16, 1024 tokens, 768 wide, inference) and a ResNet basic block
(fp32, channels-last, 64x64x56x56, inference).

Method: inputs are random (never zeros), the same tensors for every
implementation. Each compiler's *cold compile* is the wall time of its first
call (Dynamo + AOT + its pipeline + Triton compiles + the first run) with fresh
on-disk caches (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, FUSELENS_CACHE_DIR
point at a new temp dir, Inductor's FX graph cache is off); each compiler first
compiles one tiny function (not counted) so one-time imports stay out, and each
case is first compiled with backend="aot_eager" (not counted): what tracing a model
costs only the first time in a process is paid by neither compiler (before this,
Inductor, timed first, paid it for both). Run time
is `triton.testing.do_bench`'s median (CUDA events). Bytes are the fewest a
kernel must move (each input read once, each output written once); the copy
bandwidth is a 1 GiB device-to-device copy timed the same way (read + write).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_gpu_bench_")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point


def bench(fn: Callable[[], Any]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median"))


def copy_bandwidth() -> float:
    """TB/s of a 1 GiB device-to-device copy (bytes read + written)."""
    a = torch.randn(1 << 28, device="cuda")
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e12


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def make_cases() -> dict[str, Callable[[], dict]]:
    def sincos() -> dict:
        x = torch.randn(64 * 2**20, device="cuda")
        return {"fn": lambda x: torch.sin(x) ** 2 + torch.cos(x) ** 2, "args": (x,), "bytes": 2 * _nbytes(x),
                "memory_bound": True, "label": "sin^2+cos^2 64M fp32"}

    def softmax(rows: int, cols: int, dt: torch.dtype, label: str) -> Callable[[], dict]:
        def make() -> dict:
            x = torch.randn(rows, cols, device="cuda", dtype=dt)
            return {"fn": lambda x: torch.softmax(x, -1), "args": (x,), "bytes": 2 * _nbytes(x), "memory_bound": True,
                    "label": label}
        return make

    def layernorm() -> dict:
        x = torch.randn(16384, 4096, device="cuda")
        w, b = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
        return {"fn": lambda x, w, b: F.layer_norm(x, (4096,), w, b), "args": (x, w, b),
                "bytes": 2 * _nbytes(x) + _nbytes(w, b), "memory_bound": True, "label": "layernorm fp32 16384x4096"}

    def gelu() -> dict:
        x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        return {"fn": lambda x, b: F.gelu(x + b), "args": (x, b), "bytes": 2 * _nbytes(x) + _nbytes(b),
                "memory_bound": True, "label": "gelu(x+b) bf16 16384x4096"}

    def gpt2() -> dict:
        from models import GPT2Block, seeded

        m = seeded(lambda: GPT2Block(768, 12, max_seq=1024)).eval().to("cuda", torch.bfloat16)
        x = torch.randn(16, 1024, 768, device="cuda", dtype=torch.bfloat16)
        return {"fn": m, "args": (x,), "bytes": 0, "memory_bound": False, "label": "GPT-2 block bf16 16x1024x768",
                "module": True}

    def resnet() -> dict:
        from models import BasicBlock, seeded

        m = seeded(lambda: BasicBlock(64)).eval().to("cuda").to(memory_format=torch.channels_last)
        x = torch.randn(64, 64, 56, 56, device="cuda").to(memory_format=torch.channels_last)
        return {"fn": m, "args": (x,), "bytes": 0, "memory_bound": False,
                "label": "ResNet basic block fp32 CL 64x64x56x56", "module": True}

    return {
        "sincos": sincos,
        "softmax_fp32": softmax(8192, 8192, torch.float32, "softmax fp32 8192x8192"),
        "softmax_bf16": softmax(32768, 1024, torch.bfloat16, "softmax bf16 32768x1024"),
        "layernorm": layernorm,
        "gelu_bf16": gelu,
        "gpt2_block": gpt2,
        "resnet_block": resnet,
    }


def cold(fn: Callable, args: tuple) -> tuple[Any, float]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args)
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def warm_compilers() -> dict:
    """Compile one tiny function with each compiler (imports, first-time init); returns
    those times. Where fuselens' compile workers are on (option `compile_workers`),
    then wait for them to be up: process start-up stays out of every case's cold
    compile, as Inductor's pool, started at its first compile, is up by then too."""
    x = torch.randn(1024, device="cuda")
    out = {}
    for name, kw in (("inductor", {}), ("fuselens", {"backend": "fuselens"})):
        torch._dynamo.reset()
        _, s = cold(torch.compile(lambda x: torch.relu(x) * 2 + 1, **kw), (x,))
        out[name] = s
    from fuselens.compiler.runtime import compile_pool

    pool = compile_pool.get_pool(0)
    if pool is not None:
        out["fuselens_workers_ready_s"] = pool.wait_ready(60)
    return out


def relerr(a: Any, b: Any) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run_case(name: str, make: Callable[[], dict], variants: list[str], bw: float, prewarm: bool = True) -> dict:
    c = make()
    fn, args = c["fn"], c["args"]
    grad = torch.no_grad()
    grad.__enter__()
    rec: dict[str, Any] = {"case": name, "label": c["label"], "memory_bound": c["memory_bound"]}
    ref = fn(*args)
    rec["eager_ms"] = bench(lambda: fn(*args))
    if prewarm:
        # what tracing this model costs only the first time in a process (Dynamo's and
        # AOTAutograd's first pass over its modules and ops), paid by neither compiler:
        # without it the first compiler timed (Inductor) paid it for both
        torch._dynamo.reset()
        t0 = time.perf_counter()
        torch.compile(fn, backend="aot_eager")(*args)
        rec["prewarm_aot_eager_s"] = time.perf_counter() - t0
    impls: list[tuple[str, Callable]] = [
        ("inductor", lambda: torch.compile(fn)),
        ("fuselens", lambda: torch.compile(fn, backend="fuselens")),
    ]
    for v in variants:
        impls.append((f"fuselens_{v}", lambda v=v: torch.compile(fn, backend="fuselens", options={v: True})))
    for impl, build in impls:
        torch._dynamo.reset()
        try:
            compiled = build()
            from fuselens import sink
            from fuselens.events import Kernel

            with sink.collect() as events:
                out, secs = cold(compiled, args)
            if impl == "fuselens":
                from fuselens.events import PhaseTime

                rec["kernels"] = [{"name": e.name, "kind": e.kind, "source": e.source} for e in events
                                  if isinstance(e, Kernel)]
                phases: dict = {}
                for e in events:
                    if isinstance(e, PhaseTime):
                        phases[e.phase] = phases.get(e.phase, 0.0) + e.seconds
                rec["fuselens_phases"] = phases
            rec[f"{impl}_compile_s"] = secs
            rec[f"{impl}_relerr"] = relerr(out, ref)
            rec[f"{impl}_ms"] = bench(lambda: compiled(*args))
        except Exception as e:  # noqa: BLE001 - one failing implementation must not end the run
            rec[f"{impl}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if c["bytes"]:
        rec["bytes"] = c["bytes"]
        # the ceiling at this size: a device copy moving the same bytes (launch and tail effects included)
        a = torch.empty(c["bytes"] // 8, device="cuda")
        b2 = torch.empty_like(a)
        rec["copy_same_bytes_tbs"] = c["bytes"] / (bench(lambda: b2.copy_(a)) * 1e-3) / 1e12
        del a, b2
        for impl in ["eager"] + [i for i, _ in impls]:
            ms = rec.get(f"{impl}_ms")
            if ms:
                rec[f"{impl}_tbs"] = c["bytes"] / (ms * 1e-3) / 1e12
                rec[f"{impl}_pct_copy"] = 100 * rec[f"{impl}_tbs"] / bw
    grad.__exit__(None, None, None)
    return rec


def table(results: list[dict], bw: float, variants: list[str]) -> str:
    rows = ["| case | eager ms | Inductor ms | fuselens ms | fuselens TB/s (% copy) | Inductor TB/s (% copy) | "
            "fuselens vs eager | fuselens / Inductor speed | compile s Inductor | compile s fuselens | "
            "compile fuselens / Inductor |" + "".join(f" fuselens {v} ms |" for v in variants),
            "|---" * (11 + len(variants)) + "|"]
    for r in results:
        def g(k: str, fmt: str = "{:.3f}") -> str:
            return fmt.format(r[k]) if k in r else "err"

        same = r.get("copy_same_bytes_tbs")
        tb = (f"{r['fuselens_tbs']:.2f} ({r['fuselens_pct_copy']:.0f}%; {100 * r['fuselens_tbs'] / same:.0f}% of "
              f"same-size copy)" if "fuselens_tbs" in r and same else "-")
        ti = (f"{r['inductor_tbs']:.2f} ({r['inductor_pct_copy']:.0f}%; {100 * r['inductor_tbs'] / same:.0f}%)"
              if "inductor_tbs" in r and same else "-")
        sp = f"{r['eager_ms'] / r['fuselens_ms']:.2f}x" if "fuselens_ms" in r else "err"
        ri = f"{r['inductor_ms'] / r['fuselens_ms']:.2f}x" if "fuselens_ms" in r and "inductor_ms" in r else "err"
        cr = (f"{r['fuselens_compile_s'] / r['inductor_compile_s']:.2f}"
              if "fuselens_compile_s" in r and "inductor_compile_s" in r else "err")
        rows.append(f"| {r['label']} | {g('eager_ms')} | {g('inductor_ms')} | {g('fuselens_ms')} | {tb} | {ti} | {sp} | {ri} | "
                    f"{g('inductor_compile_s')} | {g('fuselens_compile_s')} | {cr} |"
                    + "".join(f" {g(f'fuselens_{v}_ms')} |" for v in variants))
    ok = [r for r in results if "fuselens_ms" in r and "inductor_ms" in r]
    if ok:
        ge = math.exp(sum(math.log(r["eager_ms"] / r["fuselens_ms"]) for r in ok) / len(ok))
        gi = math.exp(sum(math.log(r["eager_ms"] / r["inductor_ms"]) for r in ok) / len(ok))
        gr = math.exp(sum(math.log(r["inductor_ms"] / r["fuselens_ms"]) for r in ok) / len(ok))
        rows.append("")
        rows.append(f"geomean speedup over eager: fuselens {ge:.2f}x, Inductor {gi:.2f}x; fuselens/Inductor {gr:.2f}x; "
                    f"copy bandwidth {bw:.2f} TB/s")
    return "\n".join(rows)


def _option_value(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return int(v)
    except ValueError:
        return v


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--cases", default="")
    ap.add_argument("--variants", default="autotune,cuda_graphs", help="extra fuselens option sets, one column each")
    ap.add_argument("--no-prewarm", action="store_true", help="skip each case's untimed aot_eager compile "
                    "(then the first compiler timed also pays the model's first trace in the process)")
    ap.add_argument("--configure", default="", help="fuselens process defaults for every fuselens column, "
                    "e.g. compile_workers=-1 (integers, true/false)")
    args = ap.parse_args(argv)
    cases = make_cases()
    names = [c for c in args.cases.split(",") if c] or list(cases)
    variants = [v for v in args.variants.split(",") if v]
    if args.configure:
        import fuselens.compiler as fc

        fc.configure(**{k: _option_value(v) for k, v in (kv.split("=", 1) for kv in args.configure.split(","))})
    bw = copy_bandwidth()
    first = warm_compilers()
    results = []
    for n in names:
        r = run_case(n, cases[n], variants, bw, prewarm=not args.no_prewarm)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "kernels"}), flush=True)
        torch.cuda.empty_cache()
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_tbs": bw,
            "first_compile_s": first}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        pass
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_bench.json").write_text(json.dumps({"info": info, "results": results}, indent=1))
    print(json.dumps(info))
    print(table(results, bw, variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
