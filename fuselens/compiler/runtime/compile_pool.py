"""Triton compiles in worker processes, in the background.

Triton's compile of a kernel (Python front end, MLIR, LLVM, ptxas) holds the GIL
for most of its work, so the precompile threads of `triton_precompile.precompile`
overlapped little: a GPT-2 block's three kernels took 0.274 s one after another and
0.230 s in threads on the H200. Here each kernel goes to its own process
(`compile_worker.py`), and the parent does not wait at all until a kernel's first
launch, so the compiles also overlap what Dynamo does after our backend returns
(guards, bytecode). A worker's compile leaves the binary in Triton's on-disk cache;
the parent's own compile at the first launch then finds it there (a few ms).

The parent learns what to send by letting Triton specialize the kernel as the first
launch will (`JITFunction.warmup` with the launch's argument types and constexprs)
and taking the serialized specialization from `knobs.runtime.jit_cache_hook`,
which skips the compile. Workers are started as Dynamo begins tracing in a process
whose CUDA is initialized (`entry._start_workers_as_dynamo_starts`), or at the latest
when a CUDA graph enters the backend, and take jobs once ready: Triton imported
(they import neither torch nor sympy: well under a second), their warm-up compile
queued before the first job. Until then, and where anything is missing (Triton <
3.4, no CUDA), kernels compile in-process as before. Jobs are written by a
thread per worker, so handing a graph's kernels over never waits for a busy worker.
Workers are plain subprocesses (not multiprocessing), so a user's script is never
re-imported in them, and run below the parent's priority.

A worker keys each binary as the parent will look it up: with the parent's TRITON_*
variables and the parent's backend hash (`compile_worker._use_backend_hash`). It
compiles for the parent's target without touching CUDA: workers that had initialized
CUDA slowed the GPT-2 block on the H200 in both runs with them (0.594 and 0.624 ms
against 0.526-0.539), and no longer did once they compiled without it.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Optional

_hook_lock = threading.Lock()


def auto_workers() -> int:
    """Workers when the option says -1: this process's share of the CPUs (torchrun's
    LOCAL_WORLD_SIZE ranks on one host share them) but two (the parent's passes, which
    are the compile's critical path, and its threads), at most 16, none below a share
    of 4 CPUs. Real models' graphs send hundreds of kernels (MobileNetV3 training:
    ~550); with 4 workers on the H200's 16 CPUs its first call waited 7.9 s for them,
    with 8 3.5 s; ResNet-50 training's still waited 3.0 s with 8 (Inductor's pool has
    a process per CPU)."""
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    except ValueError:
        ranks = 1
    share = (os.cpu_count() or 1) // ranks
    return 0 if share < 4 else min(16, share - 2)


WORKER_ARGV = [sys.executable, "-m", "fuselens.compiler.runtime.compile_worker"]


class _Worker:
    def __init__(self, pool: "CompilePool", argv: list[str]) -> None:
        self.pool = pool
        self.ready = threading.Event()
        self.started = time.perf_counter()
        self.ready_after_s: Optional[float] = None  # how long its imports took
        self.dead = False
        self.outstanding: dict[int, Future] = {}
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
            close_fds=True,
        )
        self.reader = threading.Thread(target=self._read, name="fuselens-compile-pool", daemon=True)
        self.reader.start()
        # jobs go through a thread of their own: a worker reads its next job only after
        # compiling the last, so a graph's jobs filled the 64 KB pipe and `submit` blocked
        # until workers caught up (ResNet-50 training: 2 s of the compile on the H200)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.writer = threading.Thread(target=self._write, name="fuselens-compile-pool-jobs", daemon=True)
        self.writer.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "ready" in msg:
                if msg["ready"]:
                    self.ready_after_s = time.perf_counter() - self.started
                    self.ready.set()
                else:
                    break
                continue
            with self.pool.lock:
                fut = self.outstanding.pop(msg.get("id"), None)
            if fut is not None:
                fut.set_result(msg)
        with self.pool.lock:
            self.dead = True
            self.ready.clear()
            lost, self.outstanding = self.outstanding, {}
        for fut in lost.values():
            fut.set_result({"ok": False, "error": "the compile worker exited"})

    def _write(self) -> None:
        while True:
            line = self.outbox.get()
            if line is None:
                break
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (OSError, ValueError):  # the worker is gone: its reader fails what it holds
                break
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def send(self, job: dict, fut: Future) -> bool:
        """Queue the job for the worker; never waits for the worker to read it."""
        with self.pool.lock:
            if self.dead:
                return False
            self.outstanding[job["id"]] = fut
        self.outbox.put(json.dumps(job) + "\n")
        return True

    def stop(self) -> None:
        try:  # jobs not sent yet are dropped: the process is ending
            while True:
                self.outbox.get_nowait()
        except queue.Empty:
            pass
        self.outbox.put(None)  # the writer closes the pipe
        self.writer.join(timeout=2)
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class CompilePool:
    """`n` compile workers; `submit` hands a job to the ready one with the fewest
    jobs, or returns None when none is ready (the caller compiles itself)."""

    def __init__(self, n: int, argv: Optional[list[str]] = None) -> None:
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.workers = [_Worker(self, argv or WORKER_ARGV) for _ in range(n)]

    def _ready(self) -> list[_Worker]:
        return [w for w in self.workers if w.ready.is_set() and not w.dead]

    def ready_count(self) -> int:
        return len(self._ready())

    def wait_ready(self, timeout: float) -> float:
        """Wait until every worker is ready (or `timeout` seconds); returns the wait."""
        t = time.perf_counter()
        while self.ready_count() < len(self.workers) and time.perf_counter() - t < timeout:
            time.sleep(0.05)
        return time.perf_counter() - t

    def submit(self, module: str, name: str, spec: str, cache_dir: str, backend_hash: Optional[str] = None
               ) -> Optional[Future]:
        ready = self._ready()
        if not ready:
            return None
        w = min(ready, key=lambda w: len(w.outstanding))
        env = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
        job = {"id": next(self._ids), "module": module, "name": name, "spec": spec, "cache_dir": cache_dir, "env": env,
               "backend_hash": backend_hash}
        fut: Future = Future()
        return fut if w.send(job, fut) else None

    def close(self) -> None:
        for w in self.workers:
            w.stop()


_pool: Optional[CompilePool] = None
_pool_lock = threading.Lock()


def get_pool(workers: int) -> Optional[CompilePool]:
    """The process's pool, started at the first call with workers > 0."""
    global _pool
    if workers <= 0:
        return _pool
    with _pool_lock:
        if _pool is None:
            from triton.runtime import driver

            from fuselens.compiler.runtime.compile_worker import target_arg

            _pool = CompilePool(workers, WORKER_ARGV + ["--target", target_arg(driver.active.get_current_target())])
            atexit.register(_pool.close)
        return _pool


def specialization(fn: Any, *args: Any, **kwargs: Any) -> Optional[str]:
    """What Triton would compile for `fn.warmup(*args, **kwargs)`, serialized
    (`JITFunction.preload`'s input), without compiling it; None when this process
    already has that kernel or this Triton has no cache hook."""
    try:
        from triton import knobs

        knobs.runtime.jit_cache_hook  # noqa: B018 - Triton >= 3.4
    except (ImportError, AttributeError):
        return None
    captured: dict[str, str] = {}

    with _hook_lock:
        prev = knobs.runtime.jit_cache_hook

        def hook(*a: Any, **kw: Any) -> Any:
            info = kw.get("fn")
            if getattr(info, "jit_function", None) is fn:
                captured["spec"] = kw["compile"]["specialization_data"]
                return True  # skip the compile
            return prev(*a, **kw) if prev is not None else None

        knobs.runtime.jit_cache_hook = hook
        try:
            fn.warmup(*args, **kwargs)
        finally:
            knobs.runtime.jit_cache_hook = prev
    return captured.get("spec")


def triton_cache_dir() -> str:
    from triton import knobs

    return knobs.cache.dir


def backend_hash() -> str:
    """This process's backend part of Triton's cache key (compile_worker._use_backend_hash)."""
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver

    return make_backend(driver.active.get_current_target()).hash()
