"""One Triton compile process of `compile_pool.py` (`python -m fuselens.compiler.runtime.compile_worker`).

Reads one JSON job a line on stdin: a generated module's path, a kernel's name and
the specialization Triton serialized for it in the parent (`JITFunction.preload`'s
input). Compiling it leaves the binary in Triton's on-disk cache, where the parent's
own compile of the same specialization finds it. Answers one JSON line a job on its
protocol channel (the original stdout; anything else the process prints goes to
stderr). The first line it writes says whether it is ready: its imports are done;
one tiny compile (the warm-up) follows, before the first job is read. Started with the
parent's target (`--target`), it never initializes CUDA. It exits at the end of
its input, that is when the parent closes the pipe or exits.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import time
from typing import Any, Optional, TextIO

# A worker runs below the parent's priority, from its imports on: the parent goes on
# with the next graph's passes while workers compile (and while they start, with its
# first graph), and its passes are the compile's critical path. Only as a worker:
# the parent imports this module too.
if __name__ == "__main__" and hasattr(os, "nice"):
    try:
        os.nice(10)
    except OSError:  # pragma: no cover - not allowed here: same priority as before
        pass

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _fl_warm(x, y, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i) * 2.0)


def _protocol_channel() -> TextIO:
    # fd 1 becomes stderr: a C library or a compiler that prints must not corrupt the protocol
    fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


class CompileOnlyDriver:
    """A Triton driver that reports one target and launches nothing. Triton
    specializes and compiles without a device (ptxas ships with it) but asks its
    active driver for the device and target first; with this one a worker never
    initializes CUDA, so it holds no context on the GPU. (CI's tests use it in the
    parent too: CPUs compile real sm_90 binaries.)"""

    def __init__(self, target: Any) -> None:
        self.target = target

    def is_active(self) -> bool:
        return True

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")


def target_arg(target: Any) -> str:
    """A GPUTarget as the worker's --target argument: backend:arch:warp_size."""
    return f"{target.backend}:{target.arch}:{target.warp_size}"


def use_target(arg: str) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    backend, arch, warp = arg.split(":")
    driver.set_active(CompileOnlyDriver(GPUTarget(backend, int(arch) if arch.isdigit() else arch, int(warp))))


WARM_KERNEL = """
@triton.jit
def _fl_warm_prelude(x, y, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    v = tl.load(x + i)
    s, c = _fl_sincos(v)
    tl.store(y + i, s * c + _fl_floor(v) * _fl_rsqrt(tl.abs(v) + 1.0) + _fl_rcp_approx(v) + tl.sum(v, 0))
"""


class _Float32:
    """Prints as torch's float32, which is what Triton's specialization reads of a
    pointer argument's dtype."""

    def __str__(self) -> str:
        return "torch.float32"

    __repr__ = __str__


def _float32_pointer() -> Any:
    """A tensor argument for `JITFunction.warmup` without torch (Triton's own stand-in
    for a tensor, of a float32 that is not torch's): importing torch took a worker 3.5
    of the 7.2 s it needed to come up on the H200's host, and nothing a job does needs it."""
    from triton.runtime.jit import MockTensor

    return MockTensor(_Float32())


class _NoTorch(importlib.abc.MetaPathFinder):
    """Keeps the warm-up from importing torch: Triton 3.6 specializes a `warmup`'s
    arguments in C++ that imports torch (3.5 s on the H200's host, while the first jobs
    wait), 3.9 does not. Where it would, the warm-up fails and each worker's first job
    pays the first compile's extra cost instead (about 0.1 s). Jobs load a serialized
    specialization (`preload`), which imports no torch on Triton 3.9 (tests/
    test_compile_pool.py checks it) and no longer waits for a warm-up that does."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("no torch in a compile worker's warm-up", name=name)
        return None


def _warm() -> None:
    # A process's first compiles cost ~0.1 s more than later ones (Triton's and
    # LLVM's start, the prelude's module, its first extern library and inline
    # assembly): paid here, before reading the first job, with a cache of its own so
    # they happen even where Triton's cache already holds these kernels
    from triton import knobs

    from fuselens.compiler.runtime.triton_prelude import prelude_header, prelude_text, warm_prelude
    from fuselens.compiler.runtime.launch_config import target_options

    warm_prelude()
    from fuselens.private_dirs import remove_scratch, scratch_dir

    tmp = scratch_dir("compile-warm")
    env = os.environ.get("TRITON_CACHE_DIR")  # setting the knob sets the variable too
    guard = _NoTorch()
    sys.meta_path.insert(0, guard)
    try:
        knobs.cache.dir = tmp
        _fl_warm.warmup(_float32_pointer(), _float32_pointer(), grid=(1,), BLOCK=128)
        prelude = prelude_text(os.environ.get("TRITON_INTERPRET") == "1")
        path = os.path.join(tmp, "fl_worker_warm.py")
        with open(path, "w") as f:
            f.write(prelude_header(prelude) + WARM_KERNEL)
        try:
            mod = _module(path, {})
            mod._fl_warm_prelude.warmup(_float32_pointer(), _float32_pointer(), grid=(1,), BLOCK=128, num_warps=4,
                                        **target_options())
        except Exception:  # noqa: BLE001 - only a warm-up: a job hitting the same fault reports it
            pass
    finally:
        sys.meta_path.remove(guard)
        del knobs.cache.dir
        if env is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = env
        remove_scratch(tmp)


def _module(path: str, modules: dict[str, Any]) -> Any:
    mod = modules.get(path)
    if mod is None:
        from fuselens.private_dirs import check_private_file

        check_private_file(path)  # the job names a file: import it only from our own cache
        name = os.path.basename(path)[:-3]  # the parent's name for it: part of the kernel's identity
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        modules[path] = mod
    return mod


def _use_env(env: Any) -> None:
    """The parent's TRITON_* variables as they are now: they can change after this
    process started (Inductor points TRITON_PTXAS_PATH at torch's ptxas at its first
    compile), and the compiler's version is part of the binary's cache key."""
    if env is None:
        return
    for k in [k for k in os.environ if k.startswith("TRITON_") and k not in env]:
        del os.environ[k]
    os.environ.update(env)


def _use_backend_hash(value: Any) -> None:
    """Key binaries as the parent's Triton does. The backend's part of the cache key
    holds the ptxas version, which Triton computes once per process
    (`get_ptxas_version` is cached): after Inductor points TRITON_PTXAS_PATH at torch's
    ptxas, the parent still keys by the version it saw first, while a worker started
    later sees the new one, so every kernel missed the parent's cache. The binary is
    what the parent would build: ptxas itself is found afresh at each compile."""
    if value is None:
        return
    from triton.compiler.compiler import make_backend
    from triton.runtime import driver

    type(make_backend(driver.active.get_current_target())).hash = lambda self: value


def serve(jobs: TextIO, out: TextIO) -> None:
    from triton import knobs

    modules: dict[str, Any] = {}
    for line in jobs:
        if not line.strip():
            continue
        t = time.perf_counter()
        job = json.loads(line)
        try:
            _use_env(job.get("env"))
            _use_backend_hash(job.get("backend_hash"))
            if job.get("cache_dir"):
                knobs.cache.dir = job["cache_dir"]
            fn = getattr(_module(job["module"], modules), job["name"])
            kernel = fn.preload(job["spec"])
            fn_hash = getattr(fn, "hash", None)  # JITFunction.cache_key, computed by the preload
            res: dict[str, Any] = {"id": job["id"], "ok": True, "hash": getattr(kernel, "hash", None),
                                   "fn_hash": fn_hash if isinstance(fn_hash, str) else None}
        except Exception as e:  # noqa: BLE001 - reported to the parent, which then compiles itself
            res = {"id": job["id"], "ok": False, "error": f"{type(e).__name__}: {e}"[:1000]}
        res["secs"] = time.perf_counter() - t
        out.write(json.dumps(res) + "\n")


def main(argv: Optional[list[str]] = None) -> int:
    """`--target backend:arch:warp_size` (the parent's GPU) compiles for that target
    without touching the GPU; without it, for the active driver's device."""
    argv = sys.argv[1:] if argv is None else argv
    out = _protocol_channel()
    try:
        if "--target" in argv:
            use_target(argv[argv.index("--target") + 1])
        from fuselens.compiler.runtime.triton_prelude import install_link_filter

        install_link_filter()  # jobs carry their libraries in their options; the filter is per process
        from triton.runtime import driver

        driver.active.get_current_target()  # no target (no --target, no GPU): no jobs
    except Exception as e:  # noqa: BLE001 - the parent compiles in-process instead
        out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"[:1000]}) + "\n")
        return 1
    # Ready once imported: the parent then sends its jobs, which wait in the pipe for the
    # warm-up (about a second) instead of compiling in the parent's threads, which hold the GIL
    out.write(json.dumps({"ready": True}) + "\n")
    try:
        _warm()
    except Exception:  # noqa: BLE001 - only a warm-up: a job hitting the same fault reports it
        pass
    serve(sys.stdin, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
