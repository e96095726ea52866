"""Running generated Triton kernels: module build, launchers, launch heuristics,
autotuning cached on disk, per-kernel device timing and CUDA graphs.

* `build_module` writes a graph's Triton source (`codegen/triton.py`) to
  `<cache_dir>/triton/<sha256>.py` (Triton's JIT needs a real file to read the
  source back) and imports it; each kernel gets a `Launcher`, which the runtime
  plan calls with the kernel's tensors and size symbols (`takes_tensors`). The
  helper prelude is a module of its own beside it (codegen/triton_prelude.py),
  built once a process and shared by every graph.
* `finalize` replaces the plan interpreter by a generated straight-line wrapper
  (wrapper_codegen.py) whose launches go through `Launcher.fast_launcher`: the
  compiled kernel's launcher with grid and constexprs bound once. On CUDA that is
  torch's static launcher (static_launch.py) where it applies, so no launch pays
  for Triton's per-signature C launcher build; else Triton's own launcher.
* Launch configuration (launch_config.py): `heuristic_config` picks block sizes
  and warps from the kernel kind and sizes. With option `autotune`, the first
  launch of each size class (power-of-two buckets of the block axes) times
  `candidate_configs` with CUDA events and keeps the fastest; the choice is cached on disk under
  `<cache_dir>/triton_autotune/<sha256 of the kernel source>.json`, so the next
  process skips the tuning.
* Option `time_kernels` on CUDA brackets every launch with CUDA events; totals
  stream as `KernelTiming` events from a `sink` flusher (synchronizing only at
  flush). In the interpreter (CPU) the host clock times the synchronous launch.
* Option `cuda_graphs` (CUDA only) wraps the compiled graph: the first call per
  input signature runs normally (compiling and tuning kernels) and captures one
  CUDA graph; later calls copy the inputs into the graph's static buffers and
  replay it. The copies are a kernel of their own in the report
  (`cudagraph_input_copies`); parameters are not copied (their address is
  stable; a moved parameter re-captures). Outputs live in the graph's memory
  pool and are overwritten by the next replay, as with Inductor's CUDA graphs.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from fuselens.compiler.atomic_file import write_atomically
from fuselens.compiler.launch_config import LaunchConfig, candidate_configs, heuristic_config, size_class
from fuselens.compiler.runtime import pyexpr
from fuselens.private_dirs import check_private_file
from fuselens.compiler.static_launch import StaticKernel, launcher_api

_modules: dict[str, Any] = {}
_lock = threading.Lock()
# the most recently built graphs' libraries (debugging, tests): kernel name -> Launcher via .launchers
recent_libraries: "collections.deque[TritonLibrary]" = collections.deque(maxlen=16)


def _autotune_path(cache_dir: str, source: str) -> str:
    key = hashlib.sha256(source.encode()).hexdigest()[:40]
    return os.path.join(cache_dir, "triton_autotune", f"{key}.json")


def cuda_event_timer(run: Callable[[], None], reps: int = 10) -> float:
    """Median-free mean device time of `run` in ms (3 warm-up launches)."""
    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


class Launcher:
    """Calls one generated kernel: computes the grid from the size symbols,
    picks (or tunes) the launch configuration, optionally times the launch."""

    takes_tensors = True  # the runtime hands us tensors, not raw pointers

    def __init__(self, ks: Any, fn: Any, options: Any, source: str) -> None:
        self.ks = ks
        self.name = ks.name
        self.fn = fn
        self.kind = ks.kernel_kind
        self.nbuf = len(ks.buffers)
        self.autotune = bool(getattr(options, "autotune", False))
        self.timing = bool(getattr(options, "time_kernels", False))
        self.cache_dir = options.resolved_cache_dir()
        self.source = source
        self.configs: dict[str, LaunchConfig] = {}
        self.timer: Callable[[Callable[[], None]], float] = cuda_event_timer
        names = [s.name for s in ks.symbols]
        src = f"def _numels({', '.join(names)}):\n    return ({pyexpr(ks.xnumel)}, {pyexpr(ks.rnumel)})\n"
        ns: dict[str, Any] = {}
        exec(src, ns)  # noqa: S102 - our own printed size arithmetic
        self._numels = ns["_numels"]
        self.stats_calls = 0
        self.stats_us = 0.0
        self._launched: set[tuple] = set()  # (config, numels) launched once: later launches are timed
        self.pending: list[tuple[Any, Any]] = []
        self.graph_id = ""
        self._plans: dict[tuple, tuple] = {}
        self._cpu_scalars: Optional[bool] = None
        self._last: Optional[tuple] = None  # (compiled kernel, grid, size args, constexprs, static) of the last launch
        self._statics: dict[int, tuple] = {}  # id(compiled kernel) -> (kernel, StaticKernel or False where it cannot be used)
        self._static_api: Any = None
        self._fast: Optional[Callable] = None
        self.compiling: Optional[PendingCompile] = None  # set by precompile when a worker compiles this kernel
        if self.autotune:
            self._load_tuned()

    # -- configuration
    def _load_tuned(self) -> None:
        path = _autotune_path(self.cache_dir, self.source)
        try:
            check_private_file(path)  # UnsafePathError is an OSError: a planted file is ignored
            with open(path) as f:
                data = json.load(f)
            for k, v in data.items():
                self.configs[k] = LaunchConfig(int(v["xblock"]), int(v["rblock"]), int(v["num_warps"]))
        except (OSError, ValueError, KeyError):
            pass

    def config_for(self, xn: int, rn: int, args: Sequence[Any]) -> LaunchConfig:
        key = size_class(xn, rn)
        cfg = self.configs.get(key)
        if cfg is not None:
            return cfg
        cfg = heuristic_config(self.ks, xn, rn)
        tensors = [a for a in args[: self.nbuf] if isinstance(a, torch.Tensor)]
        on_gpu = bool(tensors) and tensors[0].device.type == "cuda"
        if self.autotune and (on_gpu or self.timer is not cuda_event_timer):
            cfg = self._tune(xn, rn, args)
            self.configs[key] = cfg
            path = _autotune_path(self.cache_dir, self.source)
            write_atomically(path, json.dumps({k: v.to_json() for k, v in self.configs.items()}, indent=1,
                                              sort_keys=True))
        else:
            self.configs[key] = cfg
        return cfg

    def _tune(self, xn: int, rn: int, args: Sequence[Any]) -> LaunchConfig:
        best, best_t = None, float("inf")
        for cfg in candidate_configs(self.ks, xn, rn):
            try:
                t = self.timer(lambda c=cfg: self._launch(c, xn, rn, args))
            except Exception:  # noqa: BLE001 - a config that does not compile (too many registers) is skipped
                continue
            if t < best_t:
                best, best_t = cfg, t
        return best or heuristic_config(self.ks, xn, rn)

    def grid(self, cfg: LaunchConfig, xn: int, rn: int) -> tuple[int]:
        gx = -(-xn // cfg.xblock)
        if self.kind == "pointwise2d":
            return (gx * -(-rn // cfg.rblock),)
        return (gx,)

    def _launch(self, cfg: LaunchConfig, xn: int, rn: int, args: Sequence[Any]) -> None:
        key = (cfg, xn, rn)
        plan = self._plans.get(key)
        if plan is None:  # grid, size arguments and keywords once per (config, sizes): less work per launch
            extra = [xn if a == "xnumel" else rn for a in self.ks.numel_args]
            kw = cfg.compile_kwargs(self.kind)
            plan = self._plans[key] = (self.grid(cfg, xn, rn), extra, kw)
        grid, extra, kw = plan
        if self._static_allowed(args):
            kernel = self.fn.run(*args, *extra, grid=grid, warmup=True, **kw)  # compile (cached), no launch
            st = self._statics.get(id(kernel), (None, None))[1]
            values = self._values(args, extra, kw)
            dev = next(a.device for a in args[: self.nbuf] if isinstance(a, torch.Tensor))
            if st is None and values is not None:
                st = StaticKernel.make(kernel, list(self.fn.arg_names), values, dev.index if dev.index is not None else 0,
                                       os.path.join(self.cache_dir, "triton")) or False
                self._statics[id(kernel)] = (kernel, st)  # the kernel kept alive: its id stays its own
            if st and values is not None:
                st.launch(grid, self._stream(dev), [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values])
                self._last = (kernel, grid, extra, kw, st)
                return
        kernel = self.fn.run(*args, *extra, grid=grid, warmup=False, **kw)
        self._last = (kernel, grid, extra, kw, None)

    def _static_allowed(self, args: Sequence[Any]) -> bool:
        """torch's static launcher (static_launch.py) instead of Triton's per-signature
        C launcher: CUDA tensors, no profiler hook that wants Triton's launch path."""
        if self._static_api is None:
            self._static_api = launcher_api() or False
        if not self._static_api or _launch_hooks():
            return False
        t = next((a for a in args[: self.nbuf] if isinstance(a, torch.Tensor)), None)
        return t is not None and t.device.type == "cuda"

    @staticmethod
    def _stream(dev: torch.device) -> int:
        return torch.cuda.current_stream(dev).cuda_stream

    def _values(self, args: Sequence[Any], extra: Sequence[Any], kw: dict) -> Optional[list]:
        """Every parameter's value in the kernel's order (positional, then the
        constexprs by name), or None if a name is missing."""
        names = list(self.fn.arg_names)
        lead = list(args) + list(extra)
        try:
            return lead + [kw[nm] for nm in names[len(lead):]]
        except KeyError:
            return None

    def statically_empty(self) -> bool:
        """True for a kernel over no elements whatever the sizes (HF models copy
        `torch.tensor([])`): there is nothing to launch."""
        return not self.ks.symbols and self._numels()[0] == 0

    # -- the direct launch path of generated wrappers (wrapper_codegen.py)
    def fast_launcher(self) -> Optional[Callable]:
        """`launch(stream, *tensors, *sizes)`: after the first launch of each
        (pointer alignment, sizes) key, calls torch's static launcher
        (static_launch.py) or else the compiled kernel's own launcher
        (`CompiledKernel.run`, a C function behind a thin Python wrapper) with the
        grid, size arguments and constexprs bound once, as Inductor's generated
        launchers do, instead of `JITFunction.run` (argument binding,
        specialization and cache key per call, ~20-40 us). Keyed by 16-byte
        alignment of every pointer because that is what Triton specialized the
        binary on; a miss goes through `__call__` (compile, tune) and fills the
        cache. None where there is nothing to bypass: the interpreter, and with
        kernel timing (its CUDA events stay on `__call__`)."""
        if self._fast is not None:
            return self._fast
        if os.environ.get("TRITON_INTERPRET") == "1" or self.timing:
            return None
        src = launcher_source(self.nbuf, len(self.ks.symbols))
        cache: dict[tuple, tuple] = {}
        ns_: dict[str, Any] = {"cache": cache, "slow": lambda key, *args: self._fill(cache, key, args)}
        exec(src, ns_)  # noqa: S102 - our own printed argument list
        self._fast = ns_["launch"]
        return self._fast

    def _fill(self, cache: dict, key: tuple, args: tuple) -> None:
        """The slow launch of `fast_launcher`; binds the direct call when it can."""
        self._last = None
        self(*args)
        last, self._last = self._last, None
        if last is None or self._cpu_scalars or _launch_hooks():
            return  # nothing launched (empty), scalars copied per call, or a profiler hook wants metadata
        kernel, grid, extra, kw, st = last
        if st:
            values = self._values(args, extra, kw)
            if values is not None:
                cache[key] = st.bound(grid, len(args), values[len(args):])
            return
        try:
            names = list(self.fn.arg_names)
            tail = tuple(extra) + tuple(kw[nm] for nm in names[len(args) + len(extra):])
            g = tuple(grid) + (1, 1)
            cache[key] = (kernel.run, g[0], g[1], g[2], kernel.function, kernel.packed_metadata, tail)
        except (AttributeError, KeyError, TypeError):  # another Triton's CompiledKernel: stay on the slow path
            pass

    def _to_device(self, args: tuple) -> tuple:
        """0-d CPU tensors (a Python scalar ATen kept as a CPU tensor) next to CUDA
        ones: Triton cannot read host memory, so copy them to the device."""
        dev = next((a.device for a in args[: self.nbuf] if isinstance(a, torch.Tensor) and a.device.type == "cuda"),
                   None)
        if dev is None:
            return args
        return tuple(a.to(dev) if i < self.nbuf and isinstance(a, torch.Tensor) and a.device.type == "cpu" else a
                     for i, a in enumerate(args))

    # -- the call the runtime makes
    def __call__(self, *args: Any) -> None:
        if self.compiling is not None:
            self.compiling.wait()
            self.compiling = None
        xn, rn = self._numels(*args[self.nbuf:])
        xn, rn = int(xn), int(rn)
        if xn <= 0 or (self.kind == "pointwise2d" and rn <= 0):
            return
        if self._cpu_scalars is None:
            self._cpu_scalars = any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args[: self.nbuf]) \
                and any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args[: self.nbuf])
        if self._cpu_scalars:
            args = self._to_device(args)
        cfg = self.config_for(xn, rn, args)
        if not self.timing:
            self._launch(cfg, xn, rn, args)
            return
        dev = next((a.device for a in args[: self.nbuf] if isinstance(a, torch.Tensor)), None)
        warm = (cfg, xn, rn)
        if warm not in self._launched:
            # the first launch of a configuration may compile the binary (JIT, or waiting
            # for a compile worker) between the events: untimed, so reported times are
            # the kernel's own (issue 17: a pointwise kernel read 390 us a call over 3 calls)
            self._launched.add(warm)
            self._launch(cfg, xn, rn, args)
            return
        if dev is not None and dev.type == "cuda" and not torch.cuda.is_current_stream_capturing():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            self._launch(cfg, xn, rn, args)
            e.record()
            with _timing_lock:
                self.pending.append((s, e))
        else:
            t0 = time.perf_counter()
            self._launch(cfg, xn, rn, args)
            with _timing_lock:
                self.stats_calls += 1
                self.stats_us += (time.perf_counter() - t0) * 1e6


def _launch_hooks() -> bool:
    """Whether a launch hook (a profiler such as proton) is installed: then every
    launch must go through Triton's own path, which builds the hook's metadata."""
    try:
        from triton import knobs

        return _hook_set(knobs.runtime.launch_enter_hook) or _hook_set(knobs.runtime.launch_exit_hook)
    except (ImportError, AttributeError):  # triton < 3.4: hooks live on CompiledKernel
        from triton.compiler import CompiledKernel

        return getattr(CompiledKernel, "launch_enter_hook", None) is not None


def _hook_set(hook: Any) -> bool:
    # Triton >= 3.5 keeps an always-present HookChain; only its `calls` say whether
    # anything is installed (taking the chain itself for a hook kept every launch on
    # the slow path: ResNet block host time 176 -> 416 us a call on an H200).
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


class TritonLibrary:
    """The launchers of one graph's module, by kernel name (what plan.py
    fetches with getattr, like a ctypes library)."""

    def __init__(self, module: Any, launchers: dict[str, Launcher], path: str) -> None:
        self.module = module
        self.path = path
        self.launchers = launchers
        for name, la in launchers.items():
            setattr(self, name, la)


def module_path(source: str, options: Any) -> str:
    key = hashlib.sha256(source.encode()).hexdigest()
    return os.path.join(options.resolved_cache_dir(), "triton", f"fl_{key[:40]}.py")


def build_module(kernels: Sequence[Any], source: str, options: Any, compile_id: str = "") -> TritonLibrary:
    """Write (once, atomically) and import a graph's Triton module."""
    path = module_path(source, options)
    with _lock:
        mod = _modules.get(path)
        if mod is None:
            if not os.path.exists(path):
                write_atomically(path, source)
            check_private_file(path)  # never import a module another account could have written
            name = os.path.basename(path)[:-3]
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod  # Triton resolves helper functions through the module's globals
            spec.loader.exec_module(mod)
            _modules[path] = mod
    launchers = {}
    for ks in kernels:
        launchers[ks.name] = Launcher(ks, getattr(mod, ks.name), options, ks.source)
    lib = TritonLibrary(mod, launchers, path)
    recent_libraries.append(lib)
    precompile(lib, options, compile_id)
    return lib


def precompile(lib: TritonLibrary, options: Any, compile_id: str = "") -> int:
    """Compile the static-shape kernels of a graph before their first launch, with
    the heuristic configuration that launch will pick (kernels with size arguments
    or under autotuning compile at launch): in the compile workers
    (compile_pool.py) in the background when they are up, each launcher then
    waiting for its own kernel at its first launch; else now, in parallel threads
    (ptxas runs as a subprocess, so threads overlap). Returns the number of
    kernels sent or compiled."""
    if os.environ.get("TRITON_INTERPRET") == "1" or getattr(options, "autotune", False):
        return 0
    if not torch.cuda.is_available():
        return 0
    jobs = []
    seen: set[tuple] = set()
    for la in lib.launchers.values():
        ks = la.ks
        if ks.symbols or ks.numel_args or not ks.buffer_dtypes:
            continue
        xn, rn = int(ks.xnumel), int(ks.rnumel)
        if xn <= 0:
            continue
        cfg = heuristic_config(ks, xn, rn)
        key = (id(la.fn), cfg, tuple(ks.buffer_dtypes))  # identical kernels share one JITFunction
        if key not in seen:
            seen.add(key)
            jobs.append((la, cfg))

    static = launcher_api()
    if static is not None and jobs and _send_to_workers(lib, jobs, options, compile_id):
        return len(jobs)

    def one(job: tuple) -> None:
        la, cfg = job
        try:
            kernel = la.fn.warmup(*la.ks.buffer_dtypes, grid=(1,), **cfg.compile_kwargs(la.kind))
            if static is None:  # Triton's own launcher will be used: build it here, in parallel
                _build_launcher(kernel)
        except Exception:  # noqa: BLE001 - the real launch compiles again and reports the error
            pass

    if len(jobs) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(8, len(jobs))) as ex:
            list(ex.map(one, jobs))
    elif jobs:
        one(jobs[0])
    return len(jobs)


def _send_to_workers(lib: TritonLibrary, jobs: list, options: Any, compile_id: str) -> bool:
    """Hand every job to the compile workers (all or none: a graph whose kernels
    compile partly here would wait for the slowest twice). False when the pool is
    off or not ready yet; it is started here for the next graph."""
    from fuselens.compiler import compile_pool

    workers = getattr(options, "compile_workers", -1)
    workers = compile_pool.auto_workers() if workers < 0 else workers
    if workers == 0:
        return False
    pool = compile_pool.get_pool(workers)
    if pool is None or pool.ready_count() == 0:
        return False
    specs = []
    for la, cfg in jobs:
        spec = compile_pool.specialization(la.fn, *la.ks.buffer_dtypes, grid=(1,), **cfg.compile_kwargs(la.kind))
        if spec is not None:
            specs.append((la.fn, spec))
    cache_dir, backend = compile_pool.triton_cache_dir(), compile_pool.backend_hash()
    pending: dict[int, PendingCompile] = {}
    for fn, spec in specs:
        fut = pool.submit(lib.path, fn.__name__, spec, cache_dir, backend)
        if fut is None:  # a worker died since: what is sent stays sent, the rest compiles at first launch
            break
        pending[id(fn)] = PendingCompile(fut, compile_id)
    for la in lib.launchers.values():
        la.compiling = pending.get(id(la.fn))
    return True


_log = logging.getLogger("fuselens.compiler")


@dataclass
class PendingCompile:
    """A kernel being compiled by a worker; its first launch waits for it once."""

    future: Any
    compile_id: str
    waited: bool = False

    def wait(self) -> None:
        if self.waited:
            return
        self.waited = True
        t = time.perf_counter()
        try:
            res = self.future.result(timeout=600)
            if not res.get("ok"):  # the launch compiles in-process and reports any real error
                _log.debug("compile worker failed: %s", res.get("error"))
        except Exception as e:  # noqa: BLE001 - as above
            _log.debug("compile worker gave no answer: %s", e)
        from fuselens import sink
        from fuselens.events import PhaseTime

        # the part of the workers' compile that the first call did not overlap
        sink.emit(PhaseTime(phase="triton_compile_wait", seconds=time.perf_counter() - t, compile_id=self.compile_id))


def _build_launcher(kernel: Any) -> None:
    """Build the kernel's C launcher module now. Triton compiles one small C
    extension per kernel signature with gcc, lazily at the first launch
    (`CompiledKernel._init_handles`), one after another: ~0.2 s each with a cold
    cache, 0.65 of the ResNet block's 1.2 s first call (profiled on the H200).
    Constructing the launcher class here, in the precompile threads, runs those
    gcc builds in parallel and leaves the module in Triton's cache, where the
    first launch finds it. Loading the binary on the device stays at the first
    launch (main thread, current CUDA context)."""
    if kernel is None or getattr(kernel, "_run", None) is not None:
        return
    from triton.runtime import driver

    cls = getattr(driver.active, "launcher_cls", None)
    if cls is not None:
        cls(kernel.src, kernel.metadata)


# -- kernel timing ---------------------------------------------------------------
_timing_lock = threading.Lock()
_timed: list[tuple[str, Launcher, list]] = []  # (graph_id, launcher, [calls, us] flushed so far)
_flusher_registered = False


def register_timing(graph_id: str, lib: TritonLibrary) -> None:
    """Let `sink.flush()` emit KernelTiming events for this graph's kernels."""
    global _flusher_registered
    from fuselens import sink

    with _timing_lock:
        for la in lib.launchers.values():
            la.graph_id = graph_id
            _timed.append((graph_id, la, [0, 0.0]))
        if not _flusher_registered:
            sink.add_flusher(flush_timings)
            _flusher_registered = True


def register_extra_timer(graph_id: str, name: str) -> "ExtraTimer":
    t = ExtraTimer(name)
    with _timing_lock:
        _timed.append((graph_id, t, [0, 0.0]))  # type: ignore[arg-type]
    return t


class ExtraTimer:
    """Device time of work that is not one of our kernels (CUDA-graph input copies, replays)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stats_calls = 0
        self.stats_us = 0.0
        self.pending: list[tuple[Any, Any]] = []


def flush_timings() -> None:
    """Resolve pending CUDA events into totals; emit the deltas since the last flush."""
    from fuselens import sink
    from fuselens.events import KernelTiming

    with _timing_lock:
        entries = list(_timed)
    for graph_id, la, last in entries:
        with _timing_lock:
            pending, la.pending = la.pending, []
        for s, e in pending:
            e.synchronize()
            la.stats_calls += 1
            la.stats_us += s.elapsed_time(e) * 1000.0
        if la.stats_calls > last[0]:
            sink.emit(KernelTiming(name=la.name, graph_id=graph_id, calls=la.stats_calls - last[0],
                                   total_time_us=la.stats_us - last[1]))
            last[0], last[1] = la.stats_calls, la.stats_us


# -- CUDA graphs -----------------------------------------------------------------
class CudaGraphRunner:
    """Replays a captured CUDA graph of a compiled graph (see the module docstring)."""

    _boxed_call = True

    def __init__(self, runner: Any, graph_id: str, timing: bool, static_inputs: Optional[set[int]] = None,
                 mutated_inputs: Sequence[int] = ()) -> None:
        self.runner = runner
        # inputs the graph overwrites: a copied one is copied back after each replay, and a
        # static one must not be overwritten by the warm-up before capture as well
        self.mutated_inputs = list(mutated_inputs)
        self.graph_id = graph_id
        # replayed in place, like Parameters; a moved one is captured again (see __call__)
        self.static_inputs = set(static_inputs or ())
        self.timing = None  # the runtime's host-clock stats: not used on this path
        self.graphs: dict[tuple, Any] = {}
        self.copy_timer = register_extra_timer(graph_id, "cudagraph_input_copies") if timing else None
        self.replay_timer = register_extra_timer(graph_id, "cudagraph_replay") if timing else None
        self.reported = False

    @staticmethod
    def _key(args: Sequence[Any]) -> tuple:
        return tuple((tuple(a.shape), tuple(a.stride()), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("v", a)
                     for a in args)

    def __call__(self, args: list) -> Any:
        key = self._key(args)
        ent = self.graphs.get(key)
        if ent is not None:
            static, params, graph, outs = ent
            if any(args[i].data_ptr() != static[i].data_ptr() for i in params):
                ent = None  # a parameter moved: capture again
        if ent is None:
            inputs = list(args)
            out = self.runner(list(args))  # warm-up: compiles and tunes kernels outside the capture
            args.clear()
            torch.cuda.synchronize()
            self.graphs[key] = self._capture(inputs)
            return out
        static, params, graph, outs = ent
        t0 = self._start(self.copy_timer)
        for i, (s, a) in enumerate(zip(static, args)):
            if isinstance(a, torch.Tensor) and i not in params:
                s.copy_(a)
        self._stop(self.copy_timer, t0)
        back = [(args[i], static[i]) for i in self.mutated_inputs if i not in params]
        args.clear()
        t1 = self._start(self.replay_timer)
        graph.replay()
        self._stop(self.replay_timer, t1)
        for a, s in back:
            a.copy_(s)
        return list(outs)

    def _capture(self, inputs: list) -> tuple:
        static, params = [], set()
        nbytes = 0
        for i, a in enumerate(inputs):
            if isinstance(a, torch.nn.Parameter) or (i in self.static_inputs and isinstance(a, torch.Tensor)):
                static.append(a)
                params.add(i)
            elif isinstance(a, torch.Tensor):
                s = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                s.copy_(a)
                static.append(s)
                nbytes += a.untyped_storage().nbytes()
            else:
                static.append(a)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        kept = [(static[i], static[i].clone()) for i in self.mutated_inputs if i in params]
        with torch.cuda.stream(side):  # one more warm-up on the capture stream (allocator state)
            self.runner(list(static))
            for t, before in kept:  # this call already applied its update; the warm-up's is undone
                t.copy_(before)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            outs = self.runner(list(static))
        if not self.reported:
            self._report(len(inputs) - len(params), nbytes)
        return static, params, graph, outs

    def _report(self, n: int, nbytes: int) -> None:
        from fuselens import sink
        from fuselens.events import Kernel

        self.reported = True
        sink.emit(Kernel(name="cudagraph_input_copies", kind="extern", graph_id=self.graph_id, ops=["aten.copy_"],
                         source=f"copy_ of {n} graph inputs ({nbytes} bytes) into the CUDA graph's static buffers "
                                "before each replay (parameters and buffers are replayed in place)",
                         language="", bytes_accessed=2 * nbytes, device="cuda"))

    @staticmethod
    def _start(timer: Optional[ExtraTimer]) -> Any:
        if timer is None:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    @staticmethod
    def _stop(timer: Optional[ExtraTimer], start: Any) -> None:
        if timer is None:
            return
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        with _timing_lock:
            timer.pending.append((start, e))


def finalize(runner: Any, lib: Optional[TritonLibrary], options: Any, graph_id: str,
             example_inputs: Sequence[Any]) -> tuple[Any, list]:
    """Attach the Triton parts to a compiled graph's runner: the device outputs
    are allocated on, device timing, and the optional CUDA-graph wrapper.
    Returns (callable, extra events)."""
    device = next((a.device for a in example_inputs if isinstance(a, torch.Tensor)), None)
    runner.device = device if device is not None and device.type == "cuda" else None
    mutated = list(getattr(runner, "mutated_inputs", ()))
    timing = bool(options.time_kernels)
    on_cuda = device is not None and device.type == "cuda"
    if lib is not None and timing and not (on_cuda and options.cuda_graphs):
        register_timing(graph_id, lib)
    from fuselens.compiler.wrapper_codegen import wrap  # straight-line Python instead of the plan interpreter

    runner = wrap(runner, fast=on_cuda) or runner
    if on_cuda and options.cuda_graphs:
        return CudaGraphRunner(runner, graph_id, timing, static_input_indices(), mutated), []
    return runner, []


def static_input_indices() -> set[int]:
    """Inputs of the graph being compiled that AOTAutograd knows keep their address
    from call to call: parameters and buffers (a BatchNorm's running statistics are
    buffers, not Parameters). Empty outside a compile."""
    try:
        from torch._guards import TracingContext

        ctx = TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
        return set(getattr(meta, "static_input_indices", None) or ())
    except (ImportError, AttributeError):  # pragma: no cover - other torch versions
        return set()


def resolve_target(target: str, example_inputs: Sequence[Any]) -> str:
    """cpp | triton for option `target` and these inputs (see codegen.resolve_target)."""
    on_cuda = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in example_inputs)
    if target == "auto":
        return "triton" if on_cuda else "cpp"
    if target == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("option target='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the "
                           "kernels in Triton's CPU interpreter)")
    if target == "cpp" and on_cuda:
        raise RuntimeError("option target='cpp' cannot run on CUDA tensors; use target='triton' or 'auto'")
    return target


def launcher_source(nbuf: int, nsym: int) -> str:
    """The source of `TritonLaunch.fast_launcher`'s `launch(stream, *tensors, *sizes)`
    for a kernel of `nbuf` tensors and `nsym` size symbols (none of either too)."""
    ts = [f"a{i}" for i in range(nbuf)]
    ss = [f"s{i}" for i in range(nsym)]
    ps = [f"p{i}" for i in range(nbuf)]

    def items(names: list[str]) -> str:  # "a, b, " or "": valid in any call and tuple
        return "".join(f"{n}, " for n in names)

    return (f"def launch(stream, {items(ts + ss)}):\n"
            + "".join(f"    {p} = {t}.data_ptr()\n" for p, t in zip(ps, ts))
            + f"    key = ({items([f'({p} & 15) == 0' for p in ps] + ss)})\n"
            "    ent = cache.get(key)\n"
            "    if ent is None:\n"
            f"        return slow(key, {items(ts + ss)})\n"
            "    if ent.__class__ is not tuple:\n"  # torch's static launcher, bound by StaticKernel.bound
            f"        return ent(stream, {items(ps + ss)})\n"
            "    run, g0, g1, g2, function, metadata, tail = ent\n"
            f"    run(g0, g1, g2, stream, function, metadata, None, None, None, {items(ps + ss)}*tail)\n")
