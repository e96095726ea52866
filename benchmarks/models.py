"""The real-model suite: eager vs Inductor vs fuselens, one process, same inputs.

    python -m benchmarks.models                               # GPU: 4 models, inference + training
    python -m benchmarks.models --device cpu                  # CPU: small configs, fp32 inference
    python -m benchmarks.models --models gpt2 --modes infer --cuda-graphs --profile
    python -m benchmarks.models --models held-out             # the models no change was tuned on

Models (benchmarks/real_models.py): Hugging Face GPT-2, Llama, BERT from configs and
torchvision's ResNet-50, random weights; held out: T5, Qwen2, ViT, MobileNetV3,
EfficientNet-B0, ConvNeXt-T, Swin-T. GPU: inference in bf16 (`model.bfloat16()`,
no_grad), training is one forward+backward under bf16 autocast; CPU: fp32.

Columns per model and backend: wall ms/step (GPU: `triton.testing.do_bench`
median; CPU: median of timed steps, the backends timed in turns), ratio Inductor/this (above 1: faster than
Inductor), GPU kernel ms/step, launches/step and host ms/step (wall minus kernel
time) from torch.profiler over a few steps, cold compile s (first call, fresh
caches; the JSON splits it by phase), peak memory of a step (allocated; the JSON also
has each of the three steps after the compile, where CUDA graphs capture), the memory
the backend added to the CUDA allocator's reservation by the end of the timed steps: reserved
then, cached free segments released, less what was live before the compile
(CUDA graphs' memory pools count here: the outputs of
Inductor's CUDA graphs do not count as allocated), on the CUDA-graph rows the pools the
backend's graphs made (reserved; not the general pool, nor pools another backend's
graphs still hold), the error against eager (relative norm error
of the output, or in training of all gradients together), and on the CPU the minor page
faults a step in the turns (memory the C library gave back and took again, which moves a
CPU step's time by 10% and more, for every backend alike).
The eager row's compile s is Dynamo's tracing alone (`backend="eager"`): the part of
every backend's cold compile that is not the backend's own; the JSON's `aot_eager_s`
adds AOTAutograd's trace and partition (`backend="aot_eager"`), which Inductor and
fuselens both run before their own work.
`--turns N` times the compiled backends again in turns after all compiled: wall, host
and pipelined ms a step (`interleaved_times`); pipelined is what a training loop that
does not wait for each step sees, the figure to read on a host-bound step. A backend that
compiles other graphs when warmed for the turns than at its own compile (Dynamo runs a frame
eagerly under every backend once one backend's compile of it failed) is timed in turns again
with eager only, after a reset; its row's `turns_note` says so.
`--cuda-graphs` adds Inductor `mode="reduce-overhead"` against fuselens'
`cuda_graphs` option. `--dropout 0.1` trains with dropout on (Hugging Face's default;
the error column is then empty: each backend draws its own numbers). `--profile` writes the top kernels of each backend and the Python functions its host time
goes to (cProfile).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_models_bench_")

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.real_models import HELD_OUT, HELD_OUT_2, MODELS, VISION, ModelCase, build, with_dropout  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_step(step: Callable[[], Any], device: str, reps: int) -> float:
    """ms per step."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median"))
    step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def back_to_back_s(step: Callable[[], Any], calls: int, device: str) -> float:
    """Seconds a step over `calls` steps queued back to back, one wait at the end, from an idle
    device: what a training loop that does not read the loss each step sees."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / calls


def _minor_faults() -> int:
    """This process's minor page faults so far (first touches of memory the system handed it)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def profile_step(step: Callable[[], Any], device: str, steps: int = 5, top: int = 40) -> dict:
    """Launches, GPU kernel ms and host ms per step, and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    step()
    _sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        wall = (time.perf_counter() - t0) * 1e3 / steps
    if device != "cuda":
        return {"wall_ms": wall}
    kernels: dict[str, list] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0, 0.0])
            k[0] += 1
            k[1] += e.device_time_total / 1e3
    launches = sum(k[0] for k in kernels.values()) / steps
    kernel_ms = sum(k[1] for k in kernels.values()) / steps
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    return {"launches": launches, "kernel_ms": kernel_ms, "host_ms": max(wall - kernel_ms, 0.0), "wall_ms": wall,
            "top": [{"name": n[:160], "calls": c / steps, "ms": ms / steps} for n, (c, ms) in top]}


def profiled_steps(step: Callable[[], Any], calls: int, device: str) -> Any:
    """A cProfile.Profile of `calls` steps, the device's queue drained after them."""
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step()
    prof.disable()
    _sync(device)
    return prof


def host_profile(step: Callable[[], Any], device: str, steps: int = 20, top: int = 25) -> list[dict]:
    """The Python functions a step's host time goes to (cProfile, own time first): what the
    profiler's host ms is made of, the same way for every backend."""
    import pstats

    step()
    _sync(device)
    prof = profiled_steps(step, steps, device)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (prim calls, calls, own s, cum s, callers)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"fn": f"{Path(f).name}:{line}({fn})", "calls": nc / steps, "own_us": 1e6 * tt / steps,
             "cum_us": 1e6 * ct / steps} for (f, line, fn), (_, nc, tt, ct, _) in rows]


def relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _output_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    return out.logits if hasattr(out, "logits") else out[0]


def placed(case: ModelCase, train: bool, device: str,
           module: Optional[torch.nn.Module] = None) -> tuple[torch.nn.Module, dict]:
    """The case's model (or `module`, a variant of it) and its inputs as the suite runs them:
    on `device`, in training mode or not; GPU inference in bf16, the images too."""
    module = (case.module if module is None else module).to(device)
    half = device == "cuda" and not train
    if half:
        module = module.bfloat16()
    module.train(train)
    inputs = case.make_inputs(device)
    if half:  # images in the model's dtype
        inputs = {k: v.bfloat16() if v.is_floating_point() else v for k, v in inputs.items()}
    return module, inputs


def make_step(case: ModelCase, module: torch.nn.Module, inputs: dict, train: bool, device: str) -> Callable:
    """One inference call, or one forward+backward (bf16 autocast on the GPU)."""
    if not train:
        def infer() -> Any:
            with torch.no_grad():
                return module(**inputs)

        return infer

    def train_step() -> Any:
        for p in module.parameters():
            p.grad = None
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = module(**inputs)
            loss = case.loss(out, inputs)
        loss.backward()
        return loss

    return train_step


def _grads(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in module.parameters() if p.grad is not None]


def run_model(name: str, mode: str, device: str, backends: list[tuple[str, dict]], profile: bool, reps: int,
              top: int = 40, turns: int = 0, dropout: float = 0.0) -> dict:
    train = mode == "train"
    torch._dynamo.reset()  # the last model's compiled code, warm from its turns
    if device == "cuda":
        # what earlier models left allocated (CUDA graphs' pools and their outputs) counts in
        # every peak below: it must be nothing, or the peaks compare different starting points
        gc.collect()
        torch.cuda.empty_cache()
        left_mb = torch.cuda.memory_allocated() / 2**20
    case = build(name, "gpu" if device == "cuda" else "cpu")
    module, inputs = placed(case, train, device, with_dropout(case.module, dropout) if dropout else None)
    rec: dict[str, Any] = {"model": name, "mode": mode, "label": case.label}
    random_steps = train and dropout > 0  # each backend draws other numbers: no error against eager
    if dropout:
        rec["dropout"] = dropout
    if device == "cuda":
        rec["allocated_before_mb"] = round(left_mb, 1)
    eager_step = make_step(case, module, inputs, train, device)
    ref = eager_step()
    ref_out = _grads(module) if train else _output_tensor(ref).clone()
    # what tracing this model costs only the first time in a process: paid by no backend
    make_step(case, torch.compile(copy.deepcopy(module), backend="aot_eager"), inputs, train, device)()
    rec["dynamo_s"] = dynamo_tracing_s(case, module, inputs, train, device)
    rec["aot_eager_s"] = dynamo_tracing_s(case, module, inputs, train, device, backend="aot_eager")
    steps: dict[str, Callable] = {}  # timed again in turns at the end
    for label, kw in backends:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        r: dict[str, Any] = {}
        rec[label] = r
        try:
            compiled = module if label == "eager" else torch.compile(module, **kw)
            step = make_step(case, compiled, inputs, train, device)
            _sync(device)
            from fuselens import sink
            from fuselens.events import ErrorEntry, Kernel, PhaseTime

            torch._dynamo.utils.compilation_time_metrics.clear()
            if device == "cuda":
                torch.cuda.synchronize()
                for p in module.parameters():  # the backend before this one's gradients, on the shared module
                    p.grad = None
                gc.collect()  # the backend before this one, once unreachable
                torch.cuda.empty_cache()
                live_before = torch.cuda.memory_allocated()
                if label.endswith("_cg"):  # the pools alive now are not this backend's
                    from benchmarks.cuda_graph_pools import pools

                    pools_before = {p["pool"] for p in pools()}
            with sink.collect() as events:
                t0 = time.perf_counter()
                out = step()
                _sync(device)
            if label != "eager":
                r["compile_s"] = time.perf_counter() - t0
                r["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
                r["compile_phases"] = compile_phases()
            if events:  # fuselens' own account of the compile: kernels by kind, fallbacks and errors
                kinds: dict[str, int] = {}
                for e in events:
                    if isinstance(e, Kernel):
                        kinds[e.kind] = kinds.get(e.kind, 0) + 1
                r["kernels_by_kind"] = kinds
                # what the first call waited for the compile workers (not one of torch's timers)
                waits = [e.seconds for e in events if isinstance(e, PhaseTime) and e.phase == "triton_compile_wait"]
                if waits and "compile_phases" in r:
                    r["compile_phases"]["fuselens.triton_compile_wait"] = round(sum(waits), 3)
                r["errors"] = sorted({f"{e.kind}: {e.message[:200]}" for e in events if isinstance(e, ErrorEntry)})[:30]
                r["tracebacks"] = [e.traceback[-2500:] for e in events
                                   if isinstance(e, ErrorEntry) and e.kind == "internal"][:3]
            # training: all gradients as one vector (a parameter whose gradient is zero in exact
            # arithmetic, such as BERT's key bias, would make a per-parameter ratio meaningless)
            if not random_steps:
                r["err"] = (relerr(torch.cat([g.flatten().float() for g in _grads(module)]),
                                   torch.cat([g.flatten().float() for g in ref_out])) if train
                            else relerr(_output_tensor(out), ref_out))
            # the first call's result is not the steps': kept, it counted in their peaks for a
            # backend whose first call returns memory of its own (our CUDA graphs' warm-up runs
            # outside the pools) and not for one whose result later replays overwrite
            # (`reduce-overhead`): the held-out-2 inference rows read exactly their outputs'
            # bytes above Inductor's (forty-third session)
            del out
            if device == "cuda":
                # the error's temporaries (every gradient in float32 and float64) stay cached in the
                # general pool, where a CUDA graph's steps, allocating in their own pools, never
                # reuse them: counted, they were most of the CUDA-graph rows' reserved MB (GPT-2
                # training: 2.9 of 4.9 GB, free in the general pool)
                torch.cuda.empty_cache()
                # the steps right after the compile, one by one: CUDA graphs capture in them
                r["step_peaks_mb"] = step_peaks_mb(step)
                torch.cuda.reset_peak_memory_stats()
                r["ms"] = time_step(step, device, reps)
            if device != "cuda" or turns:
                steps[label] = step
            if device == "cuda":
                r["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
                # what the backend added to the allocator's reservation, pools included: CUDA graphs'
                # outputs live in pools, where Inductor's (cudagraph trees) are not counted as allocated.
                # Until the twenty-fourth session this also counted what was allocated before the
                # compile (the parameters, eager's reference gradients). Measured from what was live
                # before, not reserved: the backends before left the general pool's segments more or
                # less fragmented (BERT: 1264 MB reserved before Inductor's row, 754 before ours, the
                # same tensors live), which moved a row's figure by 500 MB. Cached free segments are
                # released first; segments with a live block, and the graphs' pools, stay.
                torch.cuda.empty_cache()
                r["reserved_mb"] = (torch.cuda.memory_reserved() - live_before) / 2**20
                if label.endswith("_cg"):  # that memory by pool, and what each of our graphs holds
                    from benchmarks.cuda_graph_pools import fuselens_graphs, pools

                    r["pools"] = pools()
                    # the graphs' own memory: the pools this backend made, not the general one nor
                    # those another backend's graphs still hold (a pool left alive by an earlier
                    # model's turns was listed in both backends' rows of the next, thirty-fifth session)
                    r["own_pools_mb"] = sum(p["reserved_mb"] for p in r["pools"]
                                            if p["pool"] not in pools_before and p["pool"] != "(0, 0)")
                    if label == "fuselens_cg":
                        r["cg_graphs"] = fuselens_graphs()
                        if train:
                            from benchmarks.cuda_graph_pools import gradients_in_graph_memory

                            r["cg_gradients"] = gradients_in_graph_memory(module)
            if profile or device == "cuda":
                r.update(profile_step(step, device, top=top))
                if not profile:
                    r.pop("top", None)
                else:
                    _annotate_top(r, events)
                    r["host_top"] = host_profile(step, device)
        except Exception as e:  # noqa: BLE001 - one failing backend must not end the run
            r["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        print(json.dumps({"model": name, "mode": mode, "backend": label,
                          **{k: v for k, v in r.items() if k not in ("top", "tracebacks", "host_top")}}), flush=True)
        for tb in r.get("tracebacks", []):
            print(tb, flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    rounds = reps if device != "cuda" else turns
    warmed: dict[str, int] = {}
    faults: dict[str, float] = {}
    timed = interleaved_times(steps, rounds, device, warmed, faults)
    for label in [k for k in steps if k != "eager" and warmed.get(k) != rec[k].get("graphs")]:
        # Dynamo runs a frame eagerly, under every backend, once a backend's compile of it
        # failed ("skipping the function"): warmed after such a backend, this one compiled
        # other graphs than its own compile did (Mixtral training, transformers 5.17:
        # fuselens' one graph became Inductor's fragments). Its turns are then timed again
        # with eager's alone, after a reset, as its own compile ran.
        rec[label]["turns_note"] = (f"warmed for the turns after the other backends it compiled {warmed.get(label)} "
                                    f"graphs, against {rec[label].get('graphs')} at its own compile: timed in "
                                    "turns with eager only")
        again = interleaved_times({k: steps[k] for k in ("eager", label) if k in steps}, rounds, device,
                                  faults=faults)
        timed[label] = again[label]
        if "eager" in again:
            rec[label]["turns_eager_ms"] = again["eager"]  # (wall, host, pipelined) of eager in those turns
    for label, (wall, host, pipelined) in timed.items():
        if device != "cuda":
            rec[label]["ms"] = wall
            rec[label]["faults_per_step"] = faults.get(label)
        else:
            rec[label]["turn_wall_ms"], rec[label]["turn_host_ms"] = wall, host
            rec[label]["turn_pipelined_ms"] = pipelined
    return rec


def step_peaks_mb(step: Callable[[], Any], steps: int = 3) -> list[float]:
    """Peak memory of each of the next `steps` steps (MB)."""
    peaks = []
    for _ in range(steps):
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peaks.append(round(torch.cuda.max_memory_allocated() / 2**20, 1))
    return peaks


# torch's compile timers (`compilation_time_metrics`) that split a cold compile: Dynamo's whole
# compile and the backend's share of it (AOTAutograd, then Inductor's or fuselens' own phases),
# and a backward compiled at its first call; Dynamo's collection after each frame's compile
# (`gc`, config.run_gc_after_compile: it scans what the compile left in the young generations)
_PHASES = ("_compile.compile_inner", "OutputGraph.call_user_compiler", "create_aot_dispatcher_function",
           "aot_trace_joint_graph", "backward._backward_impl", "compile_fx.<locals>.fw_compiler_base",
           "compile_fx.<locals>.bw_compiler", "GraphLowering.compile_to_module", "async_compile.wait", "gc")


def compile_phases() -> dict[str, float]:
    """Seconds per compile phase of the compile just run (torch's timers and fuselens'
    `fuselens.*` phases, which it reports to the same timers)."""
    m = torch._dynamo.utils.compilation_time_metrics
    return {k: round(sum(v), 3) for k, v in m.items() if k in _PHASES or k.startswith("fuselens.")}


def dynamo_tracing_s(case: ModelCase, module: torch.nn.Module, inputs: dict, train: bool, device: str,
                     backend: str = "eager") -> float:
    """Seconds Dynamo takes to trace the step with no backend work (`backend="eager"`):
    the part of every backend's cold compile that is not the backend's. With
    `backend="aot_eager"`, Dynamo's trace and AOTAutograd's (the joint graph, its
    partition): what Inductor and fuselens both compile from."""
    torch._dynamo.reset()
    t0 = time.perf_counter()
    make_step(case, torch.compile(module, backend=backend), inputs, train, device)()
    _sync(device)
    return time.perf_counter() - t0


PIPELINED_STEPS = 5


def interleaved_times(steps: dict[str, Callable[[], Any]], rounds: int, device: str,
                      warmed_graphs: Optional[dict[str, int]] = None,
                      faults: Optional[dict[str, float]] = None) -> dict[str, tuple[float, ...]]:
    """(wall ms, host ms, pipelined ms) per step, medians, of each backend timed in turns. A
    shared machine's speed drifts over minutes (Inductor's GPT-2 read 16.9 and 24.4 ms 25
    minutes apart on the CPU; on the GPU machines eager's host time a step moved 2-4x between
    runs), so backends timed one after the other compare different machines; in turns, each
    round sees the same. Host ms is the time until the step returns, its kernels queued but
    not waited for (on the CPU, the wall time); wall ms waits for them too. Pipelined ms is
    a round's PIPELINED_STEPS steps back to back, one wait at the end, per step: a training
    loop that does not read the loss each step, where one step's host work overlaps the
    last one's kernels. do_bench cannot stand in for it on a host-bound step: the median of
    its per-step intervals between CUDA events read T5's Inductor step at 23.2 ms while the
    same step ran 30.8 ms a step back to back (H200, thirty-second session).
    `warmed_graphs` gets the graphs each backend compiled when warmed for the turns, and
    `faults` each one's minor page faults a step (the host's first touches of memory the C
    library gave back to the system and took again: on the CPU a large and varying part of
    a step, for every backend; RESULTS, forty-sixth session)."""
    if not steps:
        return {}
    torch._dynamo.reset()  # each backend's compiled code was dropped when the next compiled: back, warm
    graphs = torch._dynamo.utils.counters["stats"]
    for k, step in steps.items():
        before = graphs["unique_graphs"]
        for _ in range(3):  # CUDA graphs capture in the first steps
            step()
        if warmed_graphs is not None:
            warmed_graphs[k] = graphs["unique_graphs"] - before
    _sync(device)
    times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in steps}
    touched = dict.fromkeys(steps, 0)
    for _ in range(rounds):
        for k, step in steps.items():
            f0 = _minor_faults()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            _sync(device)
            t2 = time.perf_counter()
            touched[k] += _minor_faults() - f0  # counted outside the timed span
            pipelined = t2 - t0  # the CPU runs a step's kernels as it queues them: nothing to overlap
            if device == "cuda":
                pipelined = back_to_back_s(step, PIPELINED_STEPS, device)
            times[k].append((t2 - t0, t1 - t0, pipelined))
    if faults is not None and rounds:
        faults.update({k: n / rounds for k, n in touched.items()})
    return {k: tuple(1e3 * statistics.median(t[i] for t in v) for i in range(3)) for k, v in times.items()}


def _annotate_top(r: dict, events: list) -> None:
    """Each of the top kernels that fuselens generated, with the ATen ops it fused and
    its source (a profile says which kernel is slow; this says what it computes). Kernel
    names are unique within a graph only: a name two graphs share gets no source."""
    from fuselens.events import Kernel

    by_name: dict[str, list] = {}
    for e in events:
        if isinstance(e, Kernel) and e.source:
            by_name.setdefault(e.name, []).append(e)
    for t in r.get("top", []):
        found = by_name.get(t["name"], [])
        if len(found) != 1:
            if found:
                t["graphs"] = [k.graph_id for k in found]
            continue
        k = found[0]
        t["ops"] = k.ops[:40]
        t["graph"] = k.graph_id
        if k.bytes_accessed and t["calls"]:  # achieved bandwidth: how far from memory-bound it is
            t["bytes"] = k.bytes_accessed
            t["gb_per_s"] = k.bytes_accessed * t["calls"] / (t["ms"] * 1e6)
        if t["ms"] >= 0.05:
            t["source"] = k.source[:6000]


def backends_for(device: str, cuda_graphs: bool, which: list[str]) -> list[tuple[str, dict]]:
    all_: list[tuple[str, dict]] = [("eager", {}), ("inductor", {}), ("fuselens", {"backend": "fuselens"})]
    if cuda_graphs and device == "cuda":
        all_ += [("inductor_cg", {"mode": "reduce-overhead"}),
                 ("fuselens_cg", {"backend": "fuselens", "options": {"cuda_graphs": True}})]
    if "fuselens_autotune" in which:  # how far the launch heuristics are from the measured best
        all_.append(("fuselens_autotune", {"backend": "fuselens", "options": {"autotune": True}}))
    if "fuselens_fallback_random" in which:  # with --dropout: random ops in ATen, as before random_ops.py
        all_.append(("fuselens_fallback_random", {"backend": "fuselens", "options": {"fallback_random": True}}))
    return [b for b in all_ if not which or b[0] in which or b[0] == "eager"]


def vs_inductor(rec: dict, backend: str, key: str) -> str:
    """Inductor's `key` over this backend's ("1.20x": this one faster), against
    reduce-overhead for a CUDA-graph backend; "-" where either is missing."""
    base = rec.get("inductor_cg" if backend.endswith("_cg") else "inductor", {}).get(key)
    mine = rec.get(backend, {}).get(key)
    return f"{base / mine:.2f}x" if base and mine else "-"


def table(results: list[dict], backends: list[str]) -> str:
    cols = ["ms", "kernel_ms", "launches", "host_ms", "compile_s", "peak_mb", "reserved_mb", "own_pools_mb", "err"]
    heads = ["wall ms", "vs Inductor", "kernel ms", "launches", "host ms", "compile s", "peak MB", "reserved MB",
             "graphs' pools MB", "max err"]
    if any("turn_wall_ms" in r for rec in results for r in rec.values() if isinstance(r, dict)):
        cols += ["turn_wall_ms", "turn_host_ms", "turn_pipelined_ms"]
        heads += ["wall ms in turns", "host ms in turns", "pipelined ms in turns"]
    if any("faults_per_step" in r for rec in results for r in rec.values() if isinstance(r, dict)):
        cols.append("faults_per_step")
        heads.append("page faults a step")
    rows = ["| model | mode | backend | " + " | ".join(heads) + " |", "|---" * (len(heads) + 3) + "|"]
    ratios = []
    for rec in results:
        ind = rec.get("inductor", {}).get("ms")
        for b in backends:
            r = rec.get(b, {})
            if "error" in r:
                rows.append(f"| {rec['model']} | {rec['mode']} | {b} | error: {r['error'][:80]} |")
                continue
            ratio = vs_inductor(rec, b, "ms")
            if b == "fuselens" and ind and r.get("ms"):
                ratios.append(ind / r["ms"])
            vals = []
            for c in cols:
                v = rec.get("dynamo_s") if (b, c) == ("eager", "compile_s") else r.get(c)
                vals.append("-" if v is None else (f"{v:.1e}" if c == "err" else f"{v:.3g}" if c != "launches"
                                                   else f"{v:.0f}"))
            rows.append(f"| {rec['model']} | {rec['mode']} | {b} | {vals[0]} | {ratio} | " + " | ".join(vals[1:]) + " |")
    notes = [f"- {rec['model']} {rec['mode']} {b}: {rec[b]['turns_note']}" for rec in results for b in backends
             if "turns_note" in rec.get(b, {})]
    rows += ["", *notes] if notes else []
    if ratios:
        rows.append(f"\ngeomean fuselens vs Inductor: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x "
                    f"(above 1: fuselens faster), over {len(ratios)} runs")
    return "\n".join(rows)


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated, of {','.join(MODELS)} (the suite), {','.join(HELD_OUT)} (held out: "
                         f"models no change was tuned on; 'held-out' for all of those) and {','.join(HELD_OUT_2)} "
                         "('held-out-2': held out from the thirty-ninth session on)")
    ap.add_argument("--modes", default="", help="infer,train (default: both on the GPU, infer on the CPU)")
    ap.add_argument("--backends", default="", help="subset of inductor,fuselens,inductor_cg,fuselens_cg,"
                    "fuselens_autotune (launch configurations measured per kernel), fuselens_fallback_random "
                    "(random ops in ATen)")
    ap.add_argument("--cuda-graphs", action="store_true", help="add reduce-overhead / cuda_graphs columns")
    ap.add_argument("--profile", action="store_true", help="record each backend's top kernels and host functions in the JSON")
    ap.add_argument("--top", type=int, default=40, help="kernels per backend --profile records")
    ap.add_argument("--reps", type=int, default=10, help="timed steps on the CPU")
    ap.add_argument("--turns", type=int, default=0,
                    help="GPU: also time every backend in turns, this many rounds of one step each, after all "
                         "compiled (a warm recompile each): wall and host ms a step that a drifting host "
                         "cannot skew (turn_wall_ms, turn_host_ms)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="training with every nn.Dropout at this probability (Hugging Face's default: 0.1); "
                         "default 0, so that errors against eager can be measured")
    ap.add_argument("--out", default="", help="write models_bench.json here")
    args = ap.parse_args(argv)
    modes = [m for m in (args.modes or ("infer,train" if args.device == "cuda" else "infer")).split(",") if m]
    backends = backends_for(args.device, args.cuda_graphs, [b for b in args.backends.split(",") if b])
    if args.device == "cpu":
        torch.set_num_threads(torch.get_num_threads())
    info = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d")}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    results = []
    groups = {"held-out": HELD_OUT, "held-out-2": HELD_OUT_2}
    names = [n for m in args.models.split(",") if m for n in groups.get(m, (m,))]
    for m in names:
        try:
            __import__("torchvision" if m in VISION else "transformers")
        except ImportError as e:  # torchvision has no CPU wheel for every torch
            print(f"skip {m}: {e}", flush=True)
            continue
        for mode in modes:
            results.append(run_model(m, mode, args.device, backends, args.profile, args.reps, args.top, args.turns,
                                     args.dropout))
            if args.out:  # after each model: a run cut short keeps what it measured
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / "models_bench.json").write_text(json.dumps({"info": info, "results": results},
                                                                            indent=1))
    print(json.dumps(info))
    print(table(results, [b for b, _ in backends]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
