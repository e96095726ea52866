"""GPU diagnostics behind the `## GPU` notes of RESULTS.md (needs CUDA).

    python -m benchmarks.gpu_probe [--what inductor_code,host,cold] [--out DIR]

* `inductor_code`: Inductor's generated Triton kernels (and launch metadata) next to
  fuselens' for layernorm, gelu(x+b) and sin^2+cos^2 (`run_and_get_code`), to compare
  block shapes, reduction order and math calls.
* `host`: per-call host time of the compiled GPT-2 and ResNet blocks (fuselens and
  Inductor): wall time of N calls issued without synchronizing divided by N, against
  the device time per call; plus the top of a cProfile of fuselens' steady state.
* `cold`: cProfile of fuselens' cold compile of the ResNet block (fresh caches), by
  cumulative time, to see where the first call's seconds go.
* `compile_par`: each graph's Triton compile, kernel by kernel and in threads.
* `pool`: cold first call with the compile workers and without (threads).
* `layers`: cold compile of six stacked GPT-2 blocks, fuselens and Inductor.
* `kernels`: device time per kernel of one call, fuselens next to Inductor.
* `column_configs`: every launch configuration of a grid, timed, for the column
  reductions of ResNet-50's training BatchNorms (statistics and backward sums, bf16
  channels-last): which block shapes reach the memory bandwidth.
* `mm_ld`: cuBLAS on an unaligned inner size (GPT-2's vocabulary, 50257) with the
  operand's rows stored at a padded stride, against zero-padded and plain operands:
  whether a producer writing padded rows spares the pad copy.
* `epilogues`: what `torch._addmm_activation` computes on this GPU (tanh- or erf-GELU)
  and what it saves at GPT-2's MLP shape; cuDNN's fused conv+bias+ReLU at ResNet's.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_gpu_probe_")

import torch  # noqa: E402


import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.gpu import make_cases as _gpu_cases  # noqa: E402


def make_cases() -> dict[str, Callable[[], dict]]:
    """benchmarks.gpu's seven cases, and BatchNorm's training forward (batch statistics,
    bf16, channels-last) at ResNet-50's shapes, batch 32: `bn_stats_56` is 256x56x56."""
    cases = _gpu_cases()

    def bn(c: int, hw: int) -> Callable[[], dict]:
        def make() -> dict:
            x = torch.randn(32, c, hw, hw, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
            w, b = torch.randn(c, device="cuda"), torch.randn(c, device="cuda")
            return {"fn": lambda x, w, b: torch.nn.functional.batch_norm(x, None, None, w, b, True),
                    "args": (x, w, b), "bytes": 3 * x.numel() * 2, "memory_bound": True,
                    "label": f"batch norm training bf16 CL 32x{c}x{hw}x{hw}"}
        return make

    for c, hw in ((64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)):
        cases[f"bn_stats_{hw}"] = bn(c, hw)
    return cases


def _kernels_of(code: str) -> str:
    """The @triton.jit functions (with their heuristics decorators) of Inductor's output code."""
    out, keep = [], False
    for line in code.splitlines():
        if line.startswith("@triton_heuristics") or line.startswith("@triton.jit"):
            keep = True
        elif keep and line.startswith("''', device_str"):
            keep = False
            out.append("")
        if keep:
            out.append(line)
    return "\n".join(out)


def inductor_code(names: list[str]) -> None:
    from torch._inductor.utils import run_and_get_code

    from fuselens import sink
    from fuselens.events import Kernel

    cases = make_cases()
    for n in names:
        c = cases[n]()
        torch._dynamo.reset()
        with torch.no_grad():
            _, codes = run_and_get_code(torch.compile(c["fn"]), *c["args"])
        print(f"==== Inductor {n}")
        for code in codes:
            print(_kernels_of(code)[:6000])
        torch._dynamo.reset()
        with sink.collect() as events, torch.no_grad():
            torch.compile(c["fn"], backend="fuselens")(*c["args"])
        print(f"==== fuselens {n}")
        from fuselens.compiler.runtime import triton_module as tr

        for e in events:
            if isinstance(e, Kernel) and e.kind == "triton":
                print(e.source)
                la = tr.recent_libraries[-1].launchers.get(e.name)
                if la is not None:
                    print("configs:", {k: v.to_json() for k, v in la.configs.items()})


def host(names: list[str], calls: int = 200) -> None:
    cases = make_cases()
    for n in names:
        c = cases[n]()
        fn, args = c["fn"], c["args"]
        for impl, kw in (("inductor", {}), ("fuselens", {"backend": "fuselens"})):
            torch._dynamo.reset()
            with torch.no_grad():
                f = torch.compile(fn, **kw)
                for _ in range(5):
                    f(*args)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    f(*args)
                host_s = time.perf_counter() - t0
                torch.cuda.synchronize()
                total_s = time.perf_counter() - t0
                print(f"{n} {impl}: host {1e6 * host_s / calls:.0f} us/call, host+device {1e6 * total_s / calls:.0f} "
                      f"us/call", flush=True)
                if impl == "fuselens":
                    pr = cProfile.Profile()
                    pr.enable()
                    for _ in range(50):
                        f(*args)
                    pr.disable()
                    torch.cuda.synchronize()
                    s = io.StringIO()
                    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
                    print("\n".join(s.getvalue().splitlines()[6:30]))


def cold(name: str) -> None:
    cases = make_cases()
    c = cases[name]()
    torch._dynamo.reset()
    with torch.no_grad():
        c["fn"](*c["args"])  # eager first: cuDNN/cuBLAS initialisation is not the compiler's
        torch.compile(lambda x: torch.relu(x) * 2 + 1, backend="fuselens")(torch.randn(1024, device="cuda"))
        torch._dynamo.reset()
        f = torch.compile(c["fn"], backend="fuselens")
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        t0 = time.perf_counter()
        pr.enable()
        f(*c["args"])
        torch.cuda.synchronize()
        pr.disable()
        print(f"==== cold compile {name}: {time.perf_counter() - t0:.2f} s")
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
        print("\n".join(ln[:160] for ln in s.getvalue().splitlines()[6:60]))


def _hoist(src: str) -> str:
    """Move every load that depends on no computed value up to the first load (the
    weight/bias loads of a persistent layernorm are issued with the row's load,
    not after the reductions)."""
    lines = src.splitlines()
    loads = [i for i, ln in enumerate(lines) if "= tl.load(" in ln]
    if not loads:
        return src
    first = loads[0]
    movable = [i for i in loads[1:] if "tmp" not in lines[i].split("= tl.load(", 1)[1]]
    moved = [lines[i] for i in movable]
    rest = [ln for i, ln in enumerate(lines) if i not in set(movable)]
    at = rest.index(lines[first]) + 1
    return "\n".join(rest[:at] + moved + rest[at:]) + "\n"


def _variant(src: str, evict: bool, nomask: bool, hoist: bool = False) -> str:
    if hoist:
        src = _hoist(src)
    out = []
    for line in src.splitlines():
        if nomask:
            line = line.replace(", xmask, other=0)", ")").replace(", xmask)", ")")
        if evict and "tl.load(" in line and line.rstrip().endswith(")"):
            pol = "evict_first" if "xindex" in line else "evict_last"
            line = line.rstrip()[:-1] + f", eviction_policy='{pol}')"
        out.append(line)
    return "\n".join(out) + "\n"


def ln_variants(names: list[str]) -> None:
    """Time fuselens' kernel for each case with source edits: L2 eviction hints
    (streamed loads evict_first, broadcast loads evict_last), and no x masks (valid
    here: every x size is a multiple of the block)."""
    from benchmarks.gpu import bench

    cases = make_cases()
    for n in names:
        c = cases[n]()
        row = []
        for evict, nomask, hoist in ((False, False, False), (False, False, True), (True, False, True)):
            if True:
                torch._dynamo.reset()
                hook = (lambda name, src, e=evict, m=nomask, h=hoist: _variant(src, e, m, h))
                with torch.no_grad():
                    f = torch.compile(c["fn"], backend="fuselens", options={"source_hook": hook})
                    f(*c["args"])
                    ms = bench(lambda: f(*c["args"]))
                row.append(f"evict={evict} hoist={hoist}: {ms:.4f} ms")
        # looped instead of persistent rows (the shape Inductor picks), with and without autotuning
        from fuselens.compiler.codegen import triton as tg

        saved = tg.PERSISTENT_MAX
        try:
            tg.PERSISTENT_MAX = 1024
            for tune in (False, True):
                torch._dynamo.reset()
                with torch.no_grad():
                    f = torch.compile(c["fn"], backend="fuselens", options={"autotune": tune})
                    f(*c["args"])
                    ms = bench(lambda: f(*c["args"]))
                row.append(f"looped autotune={tune}: {ms:.4f} ms")
        finally:
            tg.PERSISTENT_MAX = saved
        print(f"{n}: " + "; ".join(row), flush=True)


def epilogues() -> None:
    """Library epilogues on this GPU: does `torch._addmm_activation` apply tanh-GELU
    (what library_epilogues.py assumes), and is it faster than addmm + a GELU kernel
    at GPT-2's MLP shape? Also cuDNN's conv+bias+ReLU against conv then ReLU at the
    ResNet block's shape (a candidate for the next epilogue)."""
    import torch.nn.functional as F

    from benchmarks.gpu import bench

    g = torch.Generator(device="cuda").manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        for m, k, n in ((16384, 768, 3072), (128, 64, 96), (1000, 100, 37)):
            x = torch.randn(m, k, device="cuda", generator=g).to(dt)
            w = torch.randn(n, k, device="cuda", generator=g).to(dt) * k ** -0.5
            b = torch.randn(n, device="cuda", generator=g).to(dt)
            ref = F.linear(x.double(), w.double(), b.double())
            got = torch._addmm_activation(b, x, w.t(), use_gelu=True).double()
            e_tanh = (got - F.gelu(ref, approximate="tanh")).abs().max().item()
            e_erf = (got - F.gelu(ref)).abs().max().item()
            eager = F.gelu(F.linear(x, w, b), approximate="tanh").double()
            e_eager = (eager - F.gelu(ref, approximate="tanh")).abs().max().item()
            relu_ok = torch.equal(torch._addmm_activation(b, x, w.t()), torch.relu(F.linear(x, w, b))) or \
                (torch._addmm_activation(b, x, w.t()).double() - torch.relu(ref)).abs().max().item()
            print(f"epilogue numerics {str(dt)[6:]} {m}x{k}x{n}: max|err| vs tanh-GELU {e_tanh:.2e}, vs erf-GELU "
                  f"{e_erf:.2e} (eager's own error {e_eager:.2e}); relu equal/err: {relu_ok}", flush=True)
    x = torch.randn(16384, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 768, device="cuda", dtype=torch.bfloat16) * 0.03
    b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    t_sep = bench(lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
    t_lt = bench(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True))
    t_mm = bench(lambda: F.linear(x, w, b))
    t_relu = bench(lambda: torch._addmm_activation(b, x, w.t()))
    print(f"GPT-2 MLP c_fc bf16 16384x768x3072: linear {t_mm:.4f} ms, linear+gelu kernels {t_sep:.4f} ms, "
          f"_addmm_activation gelu {t_lt:.4f} ms, relu {t_relu:.4f} ms", flush=True)
    xc = torch.randn(64, 64, 56, 56, device="cuda").to(memory_format=torch.channels_last)
    wc = torch.randn(64, 64, 3, 3, device="cuda").to(memory_format=torch.channels_last) * 0.05
    bc = torch.randn(64, device="cuda")
    t_conv = bench(lambda: F.conv2d(xc, wc, None, 1, 1))
    t_conv_relu = bench(lambda: torch.relu(F.conv2d(xc, wc, bc, 1, 1)))
    try:
        fused = torch.ops.aten.cudnn_convolution_relu.default
        t_cudnn = bench(lambda: fused(xc, wc, bc, [1, 1], [1, 1], [1, 1], 1))
        err = (fused(xc, wc, bc, [1, 1], [1, 1], [1, 1], 1) - torch.relu(F.conv2d(xc, wc, bc, 1, 1))).abs().max().item()
    except Exception as e:  # noqa: BLE001
        t_cudnn, err = float("nan"), repr(e)[:200]
    try:
        fused_add = torch.ops.aten.cudnn_convolution_add_relu.default
        t_add = bench(lambda: fused_add(xc, wc, xc, 1, bc, [1, 1], [1, 1], [1, 1], 1))
    except Exception:  # noqa: BLE001
        t_add = float("nan")
    print(f"ResNet conv fp32 CL 64x64x56x56: conv {t_conv:.4f} ms, conv+bias then relu {t_conv_relu:.4f} ms, "
          f"cudnn_convolution_relu {t_cudnn:.4f} ms (max err {err}), cudnn_convolution_add_relu {t_add:.4f} ms",
          flush=True)


def column_configs() -> None:
    """Compile BatchNorm-like column reductions with autotuning on, the candidates
    replaced by a grid, and print each candidate's time and bandwidth."""
    import fuselens.compiler
    from fuselens import sink
    from fuselens.compiler.runtime import launch_config, triton_autotune
    from fuselens.compiler.runtime.launch_config import LaunchConfig
    from fuselens.events import Kernel

    fuselens.compiler.register()
    grid = [LaunchConfig(x, r, w) for x, r, w in ((64, 64, 8), (64, 8, 4), (128, 8, 4), (64, 16, 4), (32, 16, 4),
                                                  (128, 4, 4), (64, 32, 4), (32, 32, 4), (16, 64, 4), (8, 512, 8),
                                                  (64, 8, 2), (128, 16, 8))]
    own = launch_config.candidate_configs
    seen: list = []

    def candidates(ks, xn, rn):
        return grid if ks.kernel_kind == "looped_reduction" and ks.column_reduction else own(ks, xn, rn)

    def timed(ks, xn, rn, timer, launch):
        results = []

        def t(run):
            ms = timer(run)
            results.append((run.__defaults__[0], ms))  # the candidate rides in the lambda's default
            return ms

        best = fastest_orig(ks, xn, rn, t, launch)
        seen.append((ks.name, xn, rn, results, best))
        return best

    from fuselens.compiler.runtime import triton_launcher

    fastest_orig = triton_autotune.fastest_config

    def stats(x, y):
        return torch.var_mean(x.float(), (0, 2, 3), correction=0), torch.var_mean(y.float(), (0, 2, 3), correction=0)

    def bn_backward(g1, g2, r, x, mean):
        gm = torch.where(r <= 0, 0.0, (g1 + g2).float())
        return gm.sum((0, 2, 3)), (gm * (x.float() - mean[None, :, None, None])).sum((0, 2, 3))

    cl = dict(device="cuda", dtype=torch.bfloat16)

    def img(c, hw):
        return torch.randn(32, c, hw, hw, **cl).to(memory_format=torch.channels_last)

    launch_config.candidate_configs = candidates
    triton_autotune.candidate_configs = candidates
    triton_launcher.fastest_config = timed
    try:
        cases = {"stats 64x112": (lambda x: torch.var_mean(x.float(), (0, 2, 3), correction=0), (img(64, 112),)),
                 "bn_backward 64x112": (bn_backward, (img(64, 112), img(64, 112), img(64, 112), img(64, 112),
                                                      torch.randn(64, device="cuda"))),
                 "stats 256x56": (stats, (img(256, 56), img(256, 56))),
                 "stats 1024x14": (stats, (img(1024, 14), img(1024, 14))),
                 "bn_backward 256x56": (bn_backward, (img(256, 56), img(256, 56), img(256, 56), img(256, 56),
                                                      torch.randn(256, device="cuda"))),
                 "bn_backward 512x28": (bn_backward, (img(512, 28), img(512, 28), img(512, 28), img(512, 28),
                                                      torch.randn(512, device="cuda")))}
        for name, (fn, args) in cases.items():
            torch._dynamo.reset()
            seen.clear()
            with sink.collect() as events:
                opts = {"autotune": True, "cache_dir": tempfile.mkdtemp()}  # nothing tuned before
                torch.compile(fn, backend="fuselens", options=opts)(*args)
                torch.cuda.synchronize()
            nbytes = {k.name: k.bytes_accessed for k in events if isinstance(k, Kernel) and k.bytes_accessed}
            for kname, xn, rn, rows, best in seen:
                gb = nbytes.get(kname, 0)
                cells = "; ".join(f"{c.xblock}x{c.rblock}/{c.num_warps}w {ms * 1e3:.1f}us"
                                  + (f" {gb / (ms * 1e6):.0f}GB/s" if gb else "") for c, ms in rows)
                print(f"column_configs {name} {kname} x={xn} r={rn} best={best}: {cells}", flush=True)
    finally:
        launch_config.candidate_configs = own
        triton_autotune.candidate_configs = own
        triton_launcher.fastest_config = fastest_orig


def mm_ld() -> None:
    """The logits gradient [T, V] feeds two matmuls of the backward: dX = dL @ W (inner
    size V) and dW = dL^T @ X (outer size V). Time each with dL contiguous (ld V), with its
    rows at a padded stride (ld V rounded up to 8, same V) and zero-padded to that width,
    and name the kernel cuBLAS picks."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.gpu import bench

    for t, v, h in ((4096, 50257, 768), (4096, 30522, 768)):
        vp = -(-v // 8) * 8
        w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        plain = torch.randn(t, v, device="cuda", dtype=torch.bfloat16)
        store = torch.zeros(t, vp, device="cuda", dtype=torch.bfloat16)
        strided = store[:, :v]
        strided.copy_(plain)
        wpad = torch.nn.functional.pad(w, (0, 0, 0, vp - v))
        cases = {
            "dX plain": lambda: plain @ w, "dX padded-rows": lambda: strided @ w, "dX zero-padded": lambda: store @ wpad,
            "dW plain": lambda: plain.t() @ x, "dW padded-rows": lambda: strided.t() @ x,
            "dW zero-padded": lambda: store.t() @ x,
            "pad copy": lambda: torch.nn.functional.pad(plain, (0, vp - v)),
        }
        ref = (plain.float() @ w.float())
        for name, fn in cases.items():
            ms = bench(fn)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            kern = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            err = ""
            if name.startswith("dX"):
                err = f" max err {(fn().float() - ref).abs().max().item():.3g}"
            print(f"mm_ld T={t} V={v}: {name:16s} {ms:.4f} ms{err} kernels {[k[:60] for k in kern]}", flush=True)


def kernels(names: list[str]) -> None:
    """Device time per kernel of one call (torch.profiler, 20 calls averaged), fuselens
    next to Inductor: which kernel a gap sits in."""
    from torch.profiler import ProfilerActivity, profile

    cases = make_cases()
    for n in names:
        c = cases[n]()
        for impl, kw in (("inductor", {}), ("fuselens", {"backend": "fuselens"})):
            torch._dynamo.reset()
            with torch.no_grad():
                f = torch.compile(c["fn"], **kw)
                for _ in range(5):
                    f(*c["args"])
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(20):
                        f(*c["args"])
                    torch.cuda.synchronize()
            if os.environ.get("FUSELENS_PROBE_TRACE"):  # a chrome trace to read the timeline (gaps) offline
                prof.export_chrome_trace(os.path.join(os.environ["FUSELENS_PROBE_TRACE"], f"trace_{n}_{impl}.json"))
            avg = prof.key_averages()
            rows = sorted(((e.key, e.device_time_total / 20) for e in avg if e.device_time_total > 0
                           and not e.key.startswith(("aten::", "cuda"))), key=lambda r: -r[1])
            total = sum(t for _, t in rows)
            print(f"{n} {impl}: {total:.1f} us of kernels a call; " + "; ".join(f"{k[:70]} {t:.1f}" for k, t in rows[:8]),
                  flush=True)
            # CUDA runtime calls on the host (a synchronizing call shows up here)
            api = sorted(((e.key, e.count / 20, e.cpu_time_total / 20) for e in avg if e.key.startswith("cuda")),
                         key=lambda r: -r[2])
            print(f"{n} {impl} host CUDA API per call: " + "; ".join(f"{k} x{c:g} {t:.1f} us" for k, c, t in api[:6]),
                  flush=True)


def compile_par(names: list[str]) -> None:
    """Where a cold first call's Triton time goes: how long `precompile` took inside
    it, then each kernel of the graph compiled again with a fresh Triton cache, one by
    one and all at once in threads (what precompile does). Says whether the threads
    overlap the compiles or queue on the GIL."""
    import importlib.util
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    from fuselens.compiler.runtime import triton_module as tr
    from fuselens.compiler.runtime.launch_config import heuristic_config

    cases = make_cases()
    for n in names:
        c = cases[n]()
        torch._dynamo.reset()
        spent: list[tuple[Any, float]] = []
        orig = tr.precompile

        def timed(lib: Any, options: Any, *rest: Any, _orig: Any = orig) -> int:
            t = time.perf_counter()
            k = _orig(lib, options, *rest)
            spent.append((lib, time.perf_counter() - t))
            return k

        tr.precompile = timed
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                torch.compile(c["fn"], backend="fuselens")(*c["args"])
                torch.cuda.synchronize()
                first = time.perf_counter() - t0
        finally:
            tr.precompile = orig
        print(f"{n}: first call {first:.3f} s, precompile " + ", ".join(f"{len(lib.launchers)} kernels {s:.3f} s"
                                                                        for lib, s in spent), flush=True)
        for trial, (lib, _) in enumerate(spent):
            for mode in ("serial", "threads", "serial"):
                os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fl_par_")
                name = f"fl_par_{trial}_{mode}_{time.perf_counter_ns()}"
                spec = importlib.util.spec_from_file_location(name, lib.path)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                spec.loader.exec_module(mod)
                jobs = []
                for la in lib.launchers.values():
                    ks = la.ks
                    if ks.symbols or ks.numel_args or not ks.buffer_dtypes:
                        continue
                    jobs.append((getattr(mod, ks.name), ks, heuristic_config(ks, int(ks.xnumel), int(ks.rnumel)), la.kind))

                def one(job: tuple) -> tuple[str, float]:
                    fn, ks, cfg, kind = job
                    t = time.perf_counter()
                    fn.warmup(*ks.buffer_dtypes, grid=(1,), **cfg.compile_kwargs(kind))
                    return ks.name, time.perf_counter() - t

                t0 = time.perf_counter()
                if mode == "serial":
                    each = [one(j) for j in jobs]
                else:
                    with ThreadPoolExecutor(max_workers=min(8, len(jobs))) as ex:
                        each = list(ex.map(one, jobs))
                wall = time.perf_counter() - t0
                print(f"  {mode:8s} {len(jobs)} kernels: wall {wall:.3f} s, each " +
                      ", ".join(f"{k[-24:]} {s:.3f}" for k, s in each), flush=True)


def pool(names: list[str]) -> None:
    """Cold first call of each case with the compile workers (`compile_workers: -1`)
    and without (0, threads), alternating, a fresh Triton cache and module each; the
    workers are started and ready before the first. Inductor never runs in this
    process (see RESULTS.md: after it has, the parent's cache keys differ)."""
    import tempfile

    from fuselens import sink
    from fuselens.compiler.runtime import compile_pool, triton_module
    from fuselens.events import PhaseTime

    x = torch.randn(1024, device="cuda")
    torch._dynamo.reset()
    torch.compile(lambda x: torch.relu(x) * 2 + 1, backend="fuselens", options={"compile_workers": -1})(x)  # starts the workers
    p = compile_pool.get_pool(compile_pool.auto_workers())
    print(f"{len(p.workers)} workers ready after {p.wait_ready(60):.2f} s more", flush=True)
    cases = make_cases()
    for n in names:
        c = cases[n]()
        for workers in (-1, 0, -1, 0):
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fl_pool_")
            triton_module._modules.clear()  # a new module, so new JITFunctions: nothing compiled in-process
            torch._dynamo.reset()
            fn = torch.compile(c["fn"], backend="fuselens", options={"compile_workers": workers})
            with torch.no_grad(), sink.collect() as events:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn(*c["args"])
                torch.cuda.synchronize()
                wall = time.perf_counter() - t0
            ph: dict[str, float] = {}
            for e in events:
                if isinstance(e, PhaseTime):
                    ph[e.phase] = ph.get(e.phase, 0.0) + e.seconds
            print(f"{n} workers={'auto' if workers < 0 else workers}: cold {wall:.3f} s; "
                  + " ".join(f"{k}={v * 1e3:.0f}ms" for k, v in ph.items()), flush=True)


def layers(n: int = 6) -> None:
    """Cold compile of n stacked GPT-2 blocks (bf16, 16x1024x768), fuselens and Inductor,
    after each compiled one tiny function: a real model repeats its layers, and
    identical kernels are defined and compiled once (`alias_source`). Also how many
    kernels the graph has against how many distinct functions were compiled."""
    from models import GPT2Block, seeded

    from benchmarks.gpu import cold, warm_compilers
    from fuselens.compiler.runtime import triton_module as tr

    warm_compilers()
    m = torch.nn.Sequential(*[seeded(lambda: GPT2Block(768, 12, max_seq=1024)) for _ in range(n)])
    m = m.eval().to("cuda", torch.bfloat16)
    x = torch.randn(16, 1024, 768, device="cuda", dtype=torch.bfloat16)
    import tempfile

    from fuselens.compiler.codegen import triton as tg

    shared = tg.canonical_source
    with torch.no_grad():
        ref = m(x)
        for impl, kw in (("fuselens, every kernel its own", {"backend": "fuselens"}),
                         ("fuselens", {"backend": "fuselens"}), ("inductor", {})):
            torch._dynamo.reset()
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fl_layers_")
            tg.canonical_source = (lambda ks: ks.name) if "own" in impl else shared  # type: ignore[assignment]
            f = torch.compile(m, **kw)
            out, first = cold(f, (x,))
            _, warm = cold(f, (x,))
            tg.canonical_source = shared  # type: ignore[assignment]
            err = float((out.float() - ref.float()).norm() / ref.float().norm())
            extra = ""
            if impl.startswith("fuselens") and tr.recent_libraries:
                lib = tr.recent_libraries[-1]
                extra = f", {len(lib.launchers)} Triton kernels, {len({id(la.fn) for la in lib.launchers.values()})} compiled"
            print(f"{n} GPT-2 blocks {impl}: cold compile {first - warm:.3f} s, rel err {err:.1e}{extra}", flush=True)


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--what", default="cold,inductor_code,variants,host")
    ap.add_argument("--variant-cases", default="layernorm")
    ap.add_argument("--code-cases", default="layernorm,gelu_bf16,sincos")
    ap.add_argument("--host-cases", default="gpt2_block,resnet_block")
    ap.add_argument("--cold-case", default="resnet_block")
    ap.add_argument("--kernel-cases", default="resnet_block,softmax_bf16")
    ap.add_argument("--par-cases", default="gpt2_block,resnet_block,sincos")
    a = ap.parse_args(argv)
    what = a.what.split(",")
    steps: list[tuple[str, Callable[[], None]]] = [
        ("cold", lambda: cold(a.cold_case)),  # first: nothing compiled yet in this process
        ("inductor_code", lambda: inductor_code(a.code_cases.split(","))),
        ("variants", lambda: ln_variants(a.variant_cases.split(","))),
        ("host", lambda: host(a.host_cases.split(","))),
        ("epilogues", epilogues),
        ("mm_ld", mm_ld),
        ("column_configs", column_configs),
        ("kernels", lambda: kernels(a.kernel_cases.split(","))),
        ("compile_par", lambda: compile_par(a.par_cases.split(","))),
        ("pool", lambda: pool(a.par_cases.split(","))),
        ("layers", layers),
    ]
    for key, step in steps:
        if key in what:
            try:
                step()
            except Exception as e:  # noqa: BLE001 - one probe failing must not hide the others
                print(f"probe {key} failed: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
