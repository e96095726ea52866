"""Launchers of generated Triton kernels.

A `Launcher` is what the runtime plan calls with a kernel's tensors and size
symbols (`takes_tensors`): it computes the grid from the size symbols, picks the
launch configuration (launch_config.py's heuristic, or autotuning:
triton_autotune.py) and optionally times the launch with its graph's KernelTimer
(fuselens/kernel_timing.py).
Generated wrappers (wrapper_codegen.py) call `Launcher.fast_launcher` instead: the
compiled kernel's launcher with grid and constexprs bound once. On CUDA that is
torch's static launcher (static_launch.py) where it applies, so no launch pays
for Triton's per-signature C launcher build; else Triton's own launcher.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional, Sequence

import torch

from fuselens.compiler.runtime.interpreter import pyexpr
from fuselens.compiler.runtime.launch_config import LaunchConfig, heuristic_config, size_class
from fuselens.compiler.runtime.static_launch import StaticKernel, launcher_api
from fuselens.compiler.runtime.triton_autotune import cuda_event_timer, fastest_config, load_tuned, save_tuned
from fuselens.compiler.runtime.triton_precompile import PendingCompile
from fuselens.kernel_timing import KernelTimer


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
        self.timer: Callable[[Callable[[], None]], float] = cuda_event_timer  # autotuning's clock
        self.kernel_timer: Optional[KernelTimer] = None  # the graph's, when it times kernels (finalize)
        names = [s.name for s in ks.symbols]
        src = f"def _numels({', '.join(names)}):\n    return ({pyexpr(ks.xnumel)}, {pyexpr(ks.rnumel)})\n"
        ns: dict[str, Any] = {}
        exec(src, ns)  # noqa: S102 - our own printed size arithmetic
        self._numels = ns["_numels"]
        self._launched: set[tuple] = set()  # (config, numels) launched once: later launches are timed
        self._plans: dict[tuple, tuple] = {}
        self._cpu_scalars: Optional[bool] = None
        self._last: Optional[tuple] = None  # (compiled kernel, grid, size args, constexprs, static) of the last launch
        self._statics: dict[int, tuple] = {}  # id(compiled kernel) -> (kernel, StaticKernel or False where it cannot be used)
        self._static_api: Any = None
        self._fast: Optional[Callable] = None
        self.compiling: Optional[PendingCompile] = None  # set by precompile when a worker compiles this kernel
        if self.autotune:
            self.configs.update(load_tuned(self.cache_dir, self.source))

    # -- configuration
    def config_for(self, xn: int, rn: int, args: Sequence[Any]) -> LaunchConfig:
        key = size_class(xn, rn)
        cfg = self.configs.get(key)
        if cfg is not None:
            return cfg
        cfg = heuristic_config(self.ks, xn, rn)
        tensors = [a for a in args[: self.nbuf] if isinstance(a, torch.Tensor)]
        on_gpu = bool(tensors) and tensors[0].device.type == "cuda"
        if self.autotune and (on_gpu or self.timer is not cuda_event_timer):
            if self.ks.inplace:  # an output over an input: candidates run on copies, not on this call's values
                args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            cfg = fastest_config(self.ks, xn, rn, self.timer, lambda c: self._launch(c, xn, rn, args))
            self.configs[key] = cfg
            save_tuned(self.cache_dir, self.source, self.configs)
        else:
            self.configs[key] = cfg
        return cfg

    def grid(self, cfg: LaunchConfig, xn: int, rn: int) -> tuple[int]:
        if self.kind == "combo":  # each part's blocks (codegen/triton_combo.py)
            return (sum(-(-n // cfg.xblock) for n in self.ks.parts),)
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
        cache: dict[tuple, tuple] = {}
        ns_: dict[str, Any] = {"cache": cache, "slow": lambda key, *args: self._fill(cache, key, args)}
        exec(_launcher_code(self.nbuf, len(self.ks.symbols)), ns_)  # noqa: S102 - our own printed argument list
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
        timer = self.kernel_timer
        if timer is None:
            self._launch(cfg, xn, rn, args)
            return
        warm = (cfg, xn, rn)
        if warm not in self._launched:
            # the first launch of a configuration may compile the binary (JIT, or waiting
            # for a compile worker) between the events: untimed, so reported times are
            # the kernel's own (issue 17: a pointwise kernel read 390 us a call over 3 calls)
            self._launched.add(warm)
            self._launch(cfg, xn, rn, args)
            return
        started = timer.start()
        self._launch(cfg, xn, rn, args)
        timer.stop(self.name, started)


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


@functools.lru_cache(maxsize=256)
def _launcher_code(nbuf: int, nsym: int) -> Any:
    """`launcher_source` compiled once per shape of argument list (a graph's kernels
    share a few: compiling each kernel's took ResNet-50 training 0.2 s)."""
    return compile(launcher_source(nbuf, nsym), "<fuselens-launcher>", "exec")


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
