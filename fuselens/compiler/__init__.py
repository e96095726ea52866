"""The fuselens compiler: `torch.compile(fn, backend="fuselens")`.

The package reads top to bottom as the pipeline:

    options.py     CompilerOptions, configure(), current()
    entry.py       the Dynamo backend: AOTAutograd, decompositions, per-graph driver
    joint_noops.py the joint graph's copies that change nothing, removed before partitioning
    joint_cse.py   the joint graph's common subexpressions merged before partitioning
    graph_passes.py     named FX rewrites before lowering
    lowering/      ATen/prims FX graph -> loop IR (ir.py): the walk (lowerer.py), the op
                   tables (pointwise.py, reductions.py, views.py) registered in registry.py
    inline_pointwise.py cheap producers recomputed in readers of another iteration space
    scheduler.py   fusion into kernels; every decision (and refusal) with its reason
    kernel_group.py  a kernel of the scheduler's: members, loop space, the words of its decisions
    targets/       what differs per target (Target: kernel prefix, generate, build, finalize),
                   C++ and Triton in a registry keyed by option `target`
    phases.py      compile phases timed once: PhaseTime events and torch's compile metrics
    compile_gc.py  the objects older than a compile (and Dynamo's trace of our frames) frozen, only young GC passes during it
    aot_printouts.py  AOTAutograd's printouts of a training graph skipped when no logger reads them
    codegen/       cpp.py (C++/OpenMP; its row scratch in cpp_scratch.py), triton.py (its prelude of
                   helpers: runtime/triton_prelude.py); the interface in codegen/__init__.py
    index_bounds.py  bounds of index expressions: the clamps and comparisons a loop's range decides
    runtime/       running a compiled graph:
        plan.py             order, allocations and frees of a compiled graph
        buffer_reuse.py     which dead buffer each allocation of a static GPU graph takes over
        interpreter.py      GraphRunner: interprets the plan
        wrapper_codegen.py  the plan printed once as straight-line Python (what runs)
        cpp_build.py        g++ into one cached shared library per graph
        triton_module.py    a graph's Triton module loaded; finalize (kernel timer, wrapper, CUDA graphs)
        triton_launcher.py  Launcher: grid, configuration, the direct launch path
        static_launch.py    torch's static CUDA launcher for compiled Triton kernels
        launch_config.py    Triton block sizes and warps; the configs autotuning measures
        triton_autotune.py  autotuning, its choices cached on disk
        cuda_graphs.py      capture and replay of a compiled graph as a CUDA graph
        cuda_graph_pool.py  one memory pool for graphs that feed each other; what a replay may overwrite
        capture_context.py  how one capture runs: its stream, the collector, workspaces, a refusal put right
        capture_check.py    what keeps a graph from capture (CPU tensors, host reads): said, not captured
        triton_precompile.py, compile_pool.py, compile_worker.py  compiles before the first launch
        atomic_file.py      cache files written whole (readers never see part of one)
        (kernel times: one KernelTimer per graph, made in entry.py; fuselens/kernel_timing.py)
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
