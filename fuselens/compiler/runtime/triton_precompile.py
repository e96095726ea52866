"""Compiling a graph's Triton kernels before their first launch.

The static-shape kernels of a graph compile with the configuration their first
launch will pick: in the compile workers (compile_pool.py) in the background
when they are up, each launcher then waiting for its own kernel at its first
launch (`PendingCompile`); else at once, in parallel threads.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from fuselens.compiler.runtime.launch_config import heuristic_config
from fuselens.compiler.runtime.static_launch import launcher_api

_log = logging.getLogger("fuselens.compiler")


def compiles_for_cuda() -> bool:
    """Whether Triton kernels compile for a CUDA device in this process (not the
    interpreter): what precompiling and the compile workers are for."""
    return os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()


def precompile(lib: Any, options: Any, compile_id: str = "") -> int:
    """Compile the static-shape kernels of a graph before their first launch, with
    the heuristic configuration that launch will pick (kernels with size arguments
    or under autotuning compile at launch): in the compile workers
    (compile_pool.py) in the background when they are up, each launcher then
    waiting for its own kernel at its first launch; else now, in parallel threads
    (ptxas runs as a subprocess, so threads overlap). Returns the number of
    kernels sent or compiled."""
    if getattr(options, "autotune", False) or not compiles_for_cuda():
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


def start_workers(options: Any) -> Any:
    """The process's compile workers, started now if they are not (they take seconds
    to import torch and Triton): None when the option turns them off. Called as a
    CUDA graph enters the backend too, so that the workers come up while AOTAutograd
    traces and our passes run, and the process's first graph compiles in them."""
    from fuselens.compiler.runtime import compile_pool

    workers = getattr(options, "compile_workers", -1)
    workers = compile_pool.auto_workers() if workers < 0 else workers
    if workers == 0:
        return None
    return compile_pool.get_pool(workers)


def _send_to_workers(lib: Any, jobs: list, options: Any, compile_id: str) -> bool:
    """Hand every job to the compile workers (all or none: a graph whose kernels
    compile partly here would wait for the slowest twice). False when the pool is
    off or not ready yet; it is started here for the next graph."""
    from fuselens.compiler.runtime import compile_pool

    pool = start_workers(options)
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
        pending[id(fn)] = PendingCompile(fut, compile_id, fn)
    for la in lib.launchers.values():
        la.compiling = pending.get(id(la.fn))
    return True


@dataclass
class PendingCompile:
    """A kernel being compiled by a worker; its first launch waits for it once."""

    future: Any
    compile_id: str
    fn: Any = None  # the kernel's JITFunction
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
            else:
                _adopt_source_hash(self.fn, res.get("fn_hash"))
        except Exception as e:  # noqa: BLE001 - as above
            _log.debug("compile worker gave no answer: %s", e)
        from fuselens import sink
        from fuselens.events import PhaseTime

        # the part of the workers' compile that the first call did not overlap
        sink.emit(PhaseTime(phase="triton_compile_wait", seconds=time.perf_counter() - t, compile_id=self.compile_id))


def _adopt_source_hash(fn: Any, fn_hash: Any) -> None:
    """Give the kernel's JITFunction the source hash the worker computed for the same
    module file. The first launch looks the binary up in Triton's cache by a key holding
    that hash, which Triton otherwise computes in this process by parsing the kernel's
    source and walking it for dependencies (`JITFunction.cache_key`): ResNet-50
    training's first step spent 1.2 of its 1.7 s of launches there under cProfile on
    the H200. A wrong hash would only miss the cache and compile here."""
    if fn is not None and isinstance(fn_hash, str) and getattr(fn, "hash", "") is None:
        fn.hash = fn_hash


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
