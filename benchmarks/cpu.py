"""CPU benchmark: eager vs Inductor vs fuselens, one process, same inputs.

    python -m benchmarks.cpu                       # all cases, all backends, markdown table
    python -m benchmarks.cpu --cases softmax --backends eager,fuselens --no-memory
    python -m benchmarks.cpu --dtype bfloat16      # every input in bfloat16

What is measured, and how:
- run time: median over many timed rounds after warm-up. Backends are
  interleaved round by round, so load from other processes hits them alike.
- cold compile: wall time of the first call minus one warm call, with every
  cache off: fuselens gets a fresh empty `cache_dir` per case, Inductor runs
  with `force_disable_caches` and a fresh TORCHINDUCTOR_CACHE_DIR. Each
  compiler first compiles one unrelated tiny function so that one-time imports
  are not charged to the first case (that time is printed separately).
- peak memory: torch has no CPU allocator statistics, and tracemalloc does not
  see tensor memory, so each backend runs in a fresh subprocess with glibc's
  mmap threshold pinned at 128 KiB (every tensor buffer is its own mapping,
  returned to the OS when freed); peak = VmHWM during one call (reset through
  /proc/self/clear_refs) minus VmRSS just before it. That counts every byte
  the call touches: outputs, temporaries, and anything the kernels allocate.
- correctness: every compiled result is compared to eager before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

# Inductor reads its cache dir from the environment: set before torch loads.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BACKENDS = ("eager", "inductor", "fuselens")


@dataclass
class Case:
    name: str
    label: str  # shown in the table
    fn: Callable[..., torch.Tensor]
    make_inputs: Callable[[], tuple[torch.Tensor, ...]]
    rtol: float = 1e-4
    atol: float = 1e-5


def _sincos(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _layernorm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _gelu_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b)


def _mlp_block(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    # Transformer MLP: 256 -> 1024 -> 256 with GELU, inference.
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


DTYPE = torch.float32  # of every input (--dtype)


def _seeded(*shapes: tuple[int, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
    def make() -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(0)
        return tuple(torch.randn(*s, generator=g).to(DTYPE) for s in shapes)

    return make


CASES = [
    Case("sincos", "sin²+cos² 4M", _sincos, _seeded((4 * 1024 * 1024,))),
    Case("softmax", "softmax 2k×2k", _softmax, _seeded((2048, 2048))),
    Case("layernorm", "layernorm 4k×1k", _layernorm, _seeded((4096, 1024), (1024,), (1024,))),
    Case("gelu_bias", "gelu(x+b) 4k×1k", _gelu_bias, _seeded((4096, 1024), (1024,))),
    Case("mlp", "MLP block 8k×256", _mlp_block,
         _seeded((8192, 256), (1024, 256), (1024,), (256, 1024), (256,)), rtol=1e-4, atol=1e-4),
]


def compile_for(backend: str, fn: Callable, cache_dir: Optional[str] = None) -> Callable:
    """The function as `backend` runs it; fuselens gets its own cache dir."""
    if backend == "eager":
        return fn
    if backend == "fuselens":
        import fuselens.compiler  # noqa: E402
        fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point

        options = {"cache_dir": cache_dir} if cache_dir else None
        return torch.compile(fn, backend="fuselens", options=options)
    return torch.compile(fn, backend=backend)


def disable_inductor_caches() -> None:
    try:
        torch._inductor.config.force_disable_caches = True
    except AttributeError:  # older torch: the env var has the same effect
        os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"


def _time_calls(fn: Callable, inputs: tuple, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    return (time.perf_counter() - start) / n


@dataclass
class Measured:
    ms: dict[str, float] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # fuselens compile phases
    peak_mb: dict[str, float] = field(default_factory=dict)
    ok: dict[str, str] = field(default_factory=dict)


def measure_case(case: Case, backends: list[str], rounds: int, budget_s: float) -> Measured:
    """Cold compile, correctness check, then interleaved timing rounds."""
    from fuselens import sink
    from fuselens.events import PhaseTime

    res = Measured()
    inputs = case.make_inputs()
    with torch.no_grad():
        expected = case.fn(*inputs)
        runners: dict[str, Callable] = {}
        for backend in backends:
            torch._dynamo.reset()
            fn = compile_for(backend, case.fn, tempfile.mkdtemp(prefix="bench-fuselens-"))
            with sink.collect() as events:
                t0 = time.perf_counter()
                out = fn(*inputs)
                first = time.perf_counter() - t0
            warm = _time_calls(fn, inputs, 1)
            if backend != "eager":
                res.compile_s[backend] = max(first - warm, 0.0)
            if backend == "fuselens":
                for e in events:
                    if isinstance(e, PhaseTime):
                        res.phases[e.phase] = res.phases.get(e.phase, 0.0) + e.seconds
            try:
                torch.testing.assert_close(out, expected, rtol=case.rtol, atol=case.atol)
                res.ok[backend] = "ok"
            except AssertionError as exc:
                res.ok[backend] = "WRONG: " + str(exc).splitlines()[0]
            runners[backend] = fn
        # Calls per round so one round takes ~budget/rounds per backend.
        est = {b: max(_time_calls(runners[b], inputs, 3), 1e-6) for b in backends}
        per_round = {b: max(1, int(budget_s / rounds / est[b])) for b in backends}
        samples: dict[str, list[float]] = {b: [] for b in backends}
        for _ in range(rounds):
            for b in backends:
                samples[b].append(_time_calls(runners[b], inputs, per_round[b]))
    res.ms = {b: statistics.median(s) * 1e3 for b, s in samples.items()}
    return res


# ---- peak memory, in a fresh subprocess per backend ---------------------

MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "MALLOC_TRIM_THRESHOLD_": str(128 * 1024)}


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def _memory_worker(backend: str, case_names: list[str]) -> None:
    """Print {case: peak MB of one call} as JSON (runs in the subprocess)."""
    import gc

    out: dict[str, float] = {}
    for case in [c for c in CASES if c.name in case_names]:
        torch._dynamo.reset()
        inputs = case.make_inputs()
        fn = compile_for(backend, case.fn)
        with torch.no_grad():
            for _ in range(3):  # compile, thread pools, lazily built state
                fn(*inputs)
            gc.collect()
            before = _status_kb("VmRSS")
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset VmHWM (peak RSS) to the current RSS
            result = fn(*inputs)
            peak = _status_kb("VmHWM")
        out[case.name] = (peak - before) / 1024
        del result
        gc.collect()
    print("MEMORY " + json.dumps(out))


def measure_memory(backend: str, case_names: list[str], threads: int) -> dict[str, float]:
    env = dict(os.environ, **MEMORY_ENV)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cpu", "--memory-worker", backend, "--cases", ",".join(case_names),
         "--threads", str(threads), "--dtype", str(DTYPE).replace("torch.", "")],
        capture_output=True, text=True, env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY "):
            return json.loads(line[len("MEMORY "):])
    print(f"memory worker for {backend} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
    return {}


# ---- table ---------------------------------------------------------------


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def render_table(results: dict[str, Measured], backends: list[str]) -> str:
    """Markdown table: times, ratios, compile times, peak memory."""
    head = ["case"] + [f"{b} ms" for b in backends]
    if "fuselens" in backends:
        head += ["fuselens/eager", "fuselens/inductor"] if "inductor" in backends else ["fuselens/eager"]
    compilers = [b for b in backends if b != "eager"]
    head += [f"{b} compile s" for b in compilers]
    if {"fuselens", "inductor"} <= set(backends):
        head += ["compile fuselens/inductor"]
    head += [f"peak MB {b}" for b in backends]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for case in CASES:
        if case.name not in results:
            continue
        m = results[case.name]
        row = [case.label] + [f"{m.ms[b]:.2f}" + ("" if m.ok.get(b, "ok") == "ok" else " (WRONG)") for b in backends]
        if "fuselens" in backends:
            row.append(_ratio(m.ms["fuselens"], m.ms.get("eager")))
            if "inductor" in backends:
                row.append(_ratio(m.ms["fuselens"], m.ms["inductor"]))
        row += [f"{m.compile_s[b]:.2f}" for b in compilers]
        if {"fuselens", "inductor"} <= set(backends):
            row.append(_ratio(m.compile_s["fuselens"], m.compile_s["inductor"]))
        row += [f"{m.peak_mb[b]:.1f}" if b in m.peak_mb else "-" for b in backends]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def machine_line() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()
    return (f"{os.cpu_count()} cores, {model}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
            f"load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the end")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--cases", default=",".join(c.name for c in CASES))
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per case")
    ap.add_argument("--budget", type=float, default=4.0, help="seconds of timed calls per backend and case")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads for every backend (0 = torch's default); both compilers "
                         "read it at compile time")
    ap.add_argument("--json", default="", help="write the raw numbers here")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="of every input")
    ap.add_argument("--memory-worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    if DTYPE != torch.float32:  # compared with eager in the same dtype, at torch's bfloat16 tolerances
        for c in CASES:
            c.rtol, c.atol = 1.6e-2, 1e-2
    case_names = args.cases.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_worker:
        _memory_worker(args.memory_worker, case_names)
        return 0
    backends = args.backends.split(",")
    disable_inductor_caches()

    # One-time costs (imports, first Dynamo/AOT use) on an unrelated function.
    first: dict[str, float] = {}
    for backend in [b for b in backends if b != "eager"]:
        torch._dynamo.reset()
        t0 = time.perf_counter()
        compile_for(backend, lambda x: torch.relu(x) * 3, tempfile.mkdtemp(prefix="bench-warm-"))(torch.randn(64))
        first[backend] = time.perf_counter() - t0

    results: dict[str, Measured] = {}
    for case in [c for c in CASES if c.name in case_names]:
        results[case.name] = measure_case(case, backends, args.rounds, args.budget)
        m = results[case.name]
        print(f"{case.label}: " + ", ".join(f"{b} {m.ms[b]:.2f} ms ({m.ok[b]})" for b in backends)
              + "; compile " + ", ".join(f"{b} {s:.2f} s" for b, s in m.compile_s.items()), flush=True)
        if m.phases:
            print("  fuselens phases: " + ", ".join(f"{p} {s:.2f}s" for p, s in m.phases.items()), flush=True)
    if not args.no_memory:
        for backend in backends:
            for name, mb in measure_memory(backend, case_names, args.threads).items():
                results[name].peak_mb[backend] = mb

    print()
    print(f"Machine: {machine_line()}; inputs {str(DTYPE).replace('torch.', '')}; date {time.strftime('%Y-%m-%d')}")
    print("First compile in the process (imports, one-time setup; not in the table): "
          + ", ".join(f"{b} {s:.1f} s" for b, s in first.items()))
    print()
    print(render_table(results, backends))
    wrong = [(c, b, v) for c, m in results.items() for b, v in m.ok.items() if v != "ok"]
    for c, b, v in wrong:
        print(f"WRONG RESULT: {c} with {b}: {v}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": machine_line(), "first_compile_s": first,
                       "results": {k: vars(v) for k, v in results.items()}}, fh, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
