"""Compiler options: one dataclass, a process-wide default, per-compile overrides.

    import fuselens.compiler as fc
    fc.configure(fusion=False)                 # process default, takes effect at the next compile
    torch.compile(f, backend="fuselens", options={"max_fusion_size": 8})   # this compile only

`current()` is the process default; `resolve(overrides)` merges a dict on top of it
and rejects unknown names with the list of valid ones. Options are read once per
compile, so changing them never needs a process restart (Dynamo's cache still holds
earlier compiles: call `torch._dynamo.reset()` to recompile old functions).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

Target = Literal["cpp", "triton", "auto"]


@dataclass(frozen=True)
class CompilerOptions:
    """Everything the fuselens compiler can be told. Every field is documented
    because `fuselens report` quotes option names in its fusion explanations."""

    fusion: bool = True
    """Fuse ops into kernels at all. False: one kernel per lowered op."""
    max_fusion_size: int = 64
    """Most FX nodes in one fused kernel (Inductor uses 64 too)."""
    reduction_fusion: bool = True
    """Fuse pointwise producers into reductions (prologue) and several reductions
    over the same rows into one pass (layernorm mean+var, softmax max+sum)."""
    epilogue_fusion: bool = True
    """Fuse pointwise consumers after a reduction into the reduction's kernel."""
    horizontal_fusion: bool = True
    """Fuse independent work over the same iteration space (no shared buffer)."""
    extern_epilogue_fusion: bool = True
    """Run pointwise epilogues inside the library call of a matmul/convolution where the
    library has one: on the Triton target, in inference, bias+ReLU/tanh-GELU after a
    Linear (cuBLASLt) and batch norm (folded into the weights)+bias+residual+ReLU after
    a conv2d (cuDNN); see compiler/library_epilogues.py. The C++ target has no matmul
    template: there the epilogue is its own kernel (the fusion events say so)."""
    target: Target = "auto"
    """Code generator: "cpp" (C++/OpenMP), "triton", or "auto" (cpp on CPU tensors)."""
    vector_width: int = 0
    """SIMD lanes hinted to the C++ compiler (`#pragma omp simd simdlen(N)`); 0 lets
    g++ choose from -march=native."""
    threads: int = 0
    """OpenMP threads per kernel; 0 follows torch.get_num_threads()."""
    time_kernels: bool = False
    """Time every kernel call; totals stream as KernelTiming events on sink.flush()."""
    # -- Triton target (issue 5; fuselens/compiler/triton_runtime.py) --
    autotune: bool = False
    """Triton: time a few launch configurations per kernel and size class at the
    first launch and keep the fastest (cached on disk under cache_dir); off: the
    launch heuristics decide."""
    cuda_graphs: bool = False
    """Triton on CUDA: capture the whole compiled graph as one CUDA graph and replay
    it; inputs are copied into static buffers first (reported as the kernel
    `cudagraph_input_copies`), and outputs are overwritten by the next call."""
    compile_workers: int = -1
    """Triton on CUDA: processes that compile a graph's kernels in parallel, in the
    background, each kernel's first launch waiting for its own (compile_pool.py).
    -1 picks a quarter of the CPUs, at most 4 (none below 4 CPUs); 0 compiles in
    threads of this process before the first call. Graphs compiled before the
    workers are up (~8 s after the first compile) compile in threads."""
    lower: bool = True
    """Lower ATen ops to our IR. False: every op runs through ATen (debugging aid)."""
    fallback_on_error: bool = True
    """On a compile error run the graph eagerly (and report it) instead of raising."""
    cache_dir: Optional[str] = None
    """Where compiled libraries are cached; default $FUSELENS_CACHE_DIR, $XDG_CACHE_HOME/fuselens or
    ~/.cache/fuselens. It must be yours alone: fuselens refuses a folder another account can write."""
    parallel_threshold: int = 32768
    """Kernels with fewer elements than this run single-threaded (OpenMP start-up
    costs more than it saves)."""
    cxx: str = "g++"
    """The C++ compiler."""
    extra_cflags: tuple[str, ...] = ()
    """Extra flags appended to the g++ command line."""
    source_hook: Optional[Callable[[str, str], str]] = field(default=None, compare=False)
    """Test hook: called as hook(kernel_name, source) -> source before compiling; lets
    tests inject a broken kernel to exercise the compile-error path."""

    def with_(self, **overrides: Any) -> "CompilerOptions":
        """A copy with `overrides` applied (validated)."""
        return _apply(self, overrides)

    def resolved_cache_dir(self) -> str:
        """The cache folder, created 0700 and checked to be this user's alone
        (raises private_dirs.UnsafePathError otherwise)."""
        from fuselens.private_dirs import cache_root, private_dir

        return private_dir(self.cache_dir or cache_root())

    def resolved_threads(self) -> int:
        if self.threads > 0:
            return self.threads
        import torch

        return max(1, torch.get_num_threads())


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CompilerOptions))

_lock = threading.Lock()
_current = CompilerOptions()


class UnknownOptionError(ValueError):
    """An option name that CompilerOptions does not have."""


def _apply(base: CompilerOptions, overrides: dict[str, Any]) -> CompilerOptions:
    unknown = sorted(k for k in overrides if k not in OPTION_NAMES)
    if unknown:
        raise UnknownOptionError(
            f"unknown fuselens compiler option(s) {', '.join(map(repr, unknown))}; "
            f"valid options: {', '.join(OPTION_NAMES)}"
        )
    if "target" in overrides and overrides["target"] not in ("cpp", "triton", "auto"):
        raise ValueError(f"option target must be 'cpp', 'triton' or 'auto', not {overrides['target']!r}")
    if "max_fusion_size" in overrides and int(overrides["max_fusion_size"]) < 1:
        raise ValueError("option max_fusion_size must be >= 1")
    if "extra_cflags" in overrides:
        overrides = dict(overrides, extra_cflags=tuple(overrides["extra_cflags"]))
    return dataclasses.replace(base, **overrides)


def current() -> CompilerOptions:
    """The process-wide default options."""
    return _current


def configure(**overrides: Any) -> CompilerOptions:
    """Change the process-wide default (validated); returns the new options."""
    global _current
    with _lock:
        _current = _apply(_current, overrides)
        return _current


def reset() -> CompilerOptions:
    """Back to the built-in defaults."""
    global _current
    with _lock:
        _current = CompilerOptions()
        return _current


def resolve(overrides: Optional[dict[str, Any]] = None) -> CompilerOptions:
    """The options for one compile: the process default plus `overrides`."""
    return _apply(current(), dict(overrides or {}))
