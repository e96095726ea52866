"""The fuselens compiler: `torch.compile(fn, backend="fuselens")`.

The package reads top to bottom as the pipeline:

    options.py     CompilerOptions, configure(), current()
    entry.py       the Dynamo backend: AOTAutograd, decompositions, per-graph driver
    lowering*.py   ATen/prims FX graph -> loop IR (ir.py): pointwise, reductions, views, externs
    scheduler.py   fusion into kernels; every decision (and refusal) with its reason
    codegen/       cpp.py (C++/OpenMP), triton.py (its prelude of helpers in triton_prelude.py);
                   the interface in codegen/__init__.py
    build.py       g++ into one cached shared library per graph
    plan.py        order, allocations and frees of a compiled graph
    runtime.py     GraphRunner: interprets the plan; kernel timing
    wrapper_codegen.py  the plan printed once as straight-line Python (what runs)
    triton_runtime.py   Triton launchers, autotuning, precompile, CUDA graphs
    launch_config.py    Triton block sizes and warps; the configs autotuning measures
    compile_pool.py     Triton compiles in worker processes (compile_worker.py)
    atomic_file.py      cache files written whole (readers never see part of one)
    explain.py     events for `fuselens report`

Importing this package (or `fuselens.compiler.options`) does not import torch and
registers nothing: Dynamo finds `backend="fuselens"` through the
`torch_dynamo_backends` entry point of the installed package; without an install
(a source checkout on sys.path) call `fuselens.compiler.register()` once.
"""

from fuselens.compiler.options import CompilerOptions, configure, current, reset, resolve

__all__ = ["CompilerOptions", "configure", "current", "reset", "resolve", "fuselens_backend", "register"]


def __getattr__(name: str):
    # The backend imports torch: loaded on first use only.
    if name in ("fuselens_backend", "register"):
        from fuselens.compiler import entry

        return getattr(entry, name)
    raise AttributeError(name)
