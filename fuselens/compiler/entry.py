"""Entry: `torch.compile(fn, backend="fuselens", options={...})`.

Dynamo hands us an FX graph of torch calls; AOTAutograd (`aot_module_simplified`)
functionalizes it, applies our decompositions and, when gradients are needed,
splits it into forward and backward graphs with the min-cut rematerialization
partitioner (the one Inductor uses; falls back to the default partitioner where
networkx is missing). Each resulting graph goes through our pipeline:

    lowering -> scheduling -> codegen (C++) -> build (g++, cached) -> runtime plan

Decompositions: torch's core ATen table (`torch._decomp.core_aten_decompositions`),
plus the composite ops we would rather fuse as their parts than call whole:
native_layer_norm, _softmax, _log_softmax, gelu, batch norm (functional and
inference), group norm, hardtanh, leaky_relu, elu, var_mean/var, linalg_vector_norm
and native_dropout. mm/addmm/bmm/convolution/SDPA stay whole (library calls).

Compile errors of a graph fall back to running that graph eagerly, with an
ErrorEntry naming the kernel; restart exceptions of Dynamo are never caught.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from fuselens import sink
from fuselens.compiler import options as options_mod
from fuselens.compiler.autograd_consistency import ForwardBackwardMismatch, OpPairing, checked_partition
from fuselens.compiler.runtime.cpp_build import KernelCompileError, build
from fuselens.compiler.codegen import get_generator
from fuselens.events import ErrorEntry, FusionDecision, PhaseTime, SourceLocation

aten = torch.ops.aten


def _restart_exceptions() -> tuple[type, ...]:
    try:
        import torch._dynamo.exc as exc
    except ImportError:  # pragma: no cover
        return ()
    names = ("RestartAnalysis", "TensorifyScalarRestartAnalysis", "SkipFrame", "SpeculationRestartAnalysis",
             "UnspecializeRestartAnalysis")
    return tuple(getattr(exc, n) for n in names if hasattr(exc, n))


RESTARTS = _restart_exceptions()


def decompositions() -> dict:
    """The decomposition table (documented in the module docstring); a copy of the
    one built once per process (building it walks every ATen op: ~0.1 s a compile)."""
    return dict(_decomposition_table())


@functools.lru_cache(maxsize=1)
def _decomposition_table() -> dict:
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    extra = [
        aten.native_layer_norm, aten._softmax, aten._log_softmax, aten.gelu, aten.native_batch_norm,
        aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit,
        aten._native_batch_norm_legit_no_training, aten.native_group_norm, aten.hardtanh, aten.leaky_relu,
        aten.elu, aten.var_mean, aten.var, aten.linalg_vector_norm, aten.native_dropout, aten.mean,
    ]
    table.update(get_decompositions([op for op in extra if op is not None]))
    # ops we lower ourselves: keep them whole
    for keep in (aten.var_mean.correction, aten.var.correction, aten.mean.dim, aten.mean.default):
        table.pop(keep, None)
    # max_unpool's decomposition (index_put into a contiguous view) loses eager's
    # output layout: eager returns the input's memory format (channels-last in,
    # channels-last out). Run it whole in ATen (an extern), which keeps the layout.
    for op in (getattr(aten, "max_unpool2d", None), getattr(aten, "max_unpool3d", None)):
        for ov in (op.overloads() if op is not None else []):
            table.pop(getattr(op, ov), None)
    # torch decomposes the CPU flash attention into math that returns the attention
    # weights where the op returns its logsumexp; its backward (one ATen call) reads
    # that output. Forward and backward must agree: keep the op whole, as Inductor
    # does. autograd_consistency checks the rule on every joint graph.
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    return table


_ids = itertools.count()
_ids_lock = threading.Lock()
_used_graph_ids: set[str] = set()


def _compile_id() -> str:
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        return str(cid) if cid is not None else ""
    except (ImportError, AttributeError):
        return ""


def _graph_id(compile_id: str, stage: str) -> str:
    base = f"{compile_id or 'x'}:{stage}"
    with _ids_lock:
        gid = base
        while gid in _used_graph_ids:
            gid = f"{base}#{next(_ids)}"
        _used_graph_ids.add(gid)
    return gid


def _user_location(gm: torch.fx.GraphModule) -> tuple[str, SourceLocation]:
    from fuselens.compiler.explain import location_from_stack

    for n in gm.graph.nodes:
        loc = location_from_stack(n.meta.get("stack_trace") or "")
        if loc is not None:
            return loc.function, loc
    return "<unknown>", SourceLocation(file="<unknown>", line=0)


def _boxed(fn: Callable) -> Callable:
    def run(args: list) -> Any:
        out = fn(*args)
        args.clear()
        return out

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, stage: str, opts: Any,
                  compile_id: str, function: str, location: SourceLocation, aot_start: Optional[float] = None) -> Callable:
    """One AOT graph through our pipeline; returns a boxed callable."""
    from fuselens.compiler.explain import build_events
    from fuselens.compiler.lowering import lower
    from fuselens.compiler.runtime.plan import make_runner
    from fuselens.compiler.scheduler import schedule

    graph_id = _graph_id(compile_id, stage)
    phases: list[tuple[str, float]] = []
    if aot_start is not None:
        phases.append(("aot", time.perf_counter() - aot_start))
    try:
        from fuselens.compiler.codegen import resolve_target

        target = resolve_target(opts.target, example_inputs)
        t = time.perf_counter()
        rewrites = rewrite_graph(gm, target, example_inputs, stage)
        phases.append(("graph_passes", time.perf_counter() - t))
        t = time.perf_counter()
        graph, outputs = lower(gm, opts)
        phases.append(("lowering", time.perf_counter() - t))
        t = time.perf_counter()
        from fuselens.compiler.ir import TensorValue
        from fuselens.compiler.lowering.lowerer import sources_of

        out_sources: set[str] = set()
        for o in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            if isinstance(o, torch.fx.Node):
                v = graph.values.get(o.name)
                for tv in v if isinstance(v, tuple) else [v]:
                    if isinstance(tv, TensorValue):
                        out_sources |= sources_of(tv)
        from fuselens.compiler.inline_pointwise import inline_pointwise

        inlined = inline_pointwise(graph, out_sources)
        sched = schedule(graph, opts, out_sources)
        phases.append(("scheduling", time.perf_counter() - t))
        t = time.perf_counter()
        gen = get_generator(target)
        if target == "triton":
            for grp in sched.groups:
                grp.name = grp.name.replace("cpp_fused", "triton_fused", 1)
        kernels = {}
        spans = []
        parts = []  # what the library holds: each kernel, or an alias of an identical one
        first_of: dict[str, Any] = {}
        line = gen.library_source([]).count("\n") + 1
        for grp in sched.groups:
            ks = gen.generate(grp, graph, opts)
            if opts.source_hook is not None:
                ks.source = opts.source_hook(grp.name, ks.source)
            kernels[grp.name] = ks
            same = first_of.setdefault(gen.canonical_source(ks), ks)
            part = ks if same is ks else dataclasses.replace(ks, source=gen.alias_source(ks, same))
            n = part.source.count("\n") + 1
            spans.append((grp.name, line, line + n))
            line += n
            parts.append(part)
        source = gen.library_source(parts)
        phases.append(("codegen", time.perf_counter() - t))
        t = time.perf_counter()
        if target == "triton":  # Triton target (issue 5): import the module; kernels JIT-compile at first launch
            from fuselens.compiler.runtime.triton_module import build_module, finalize

            lib = build_module(list(kernels.values()), source, opts, compile_id) if parts else None
            phases.append(("triton_compile", time.perf_counter() - t))
        else:
            lib = build(source, opts, spans).lib if parts else None
            phases.append(("cpp_compile", time.perf_counter() - t))
        runner = make_runner(graph, sched, kernels, lib, outputs, opts.time_kernels and target == "cpp")
        events = build_events(gm, graph, sched, kernels, graph_id, compile_id, stage, function, location)
        events.extend(FusionDecision(decision="fused", nodes=[r.node], reason=r.detail, graph_id=graph_id, rule=r.rule)
                      for r in rewrites)
        kernel_of = {n.name: grp.name for grp in sched.groups for n in grp.nodes}
        events.extend(FusionDecision(decision="fused", nodes=[i.node, *i.readers], reason=i.reason(),
                                     kernel=kernel_of.get(i.readers[0]), graph_id=graph_id, rule="inline")
                      for i in inlined)
        if target == "triton":  # device allocation, CUDA-event timing, optional CUDA graph (runtime/triton_module.py)
            runner, extra_events = finalize(runner, lib, opts, graph_id, example_inputs)
            events.extend(extra_events)
        else:  # straight-line Python instead of the plan interpreter
            from fuselens.compiler.runtime.wrapper_codegen import wrap

            runner = wrap(runner, fast=False) or runner
    except RESTARTS:
        raise
    except KernelCompileError as e:
        if not opts.fallback_on_error:
            raise
        _report_fallback("compile", str(e), compile_id, traceback.format_exc(), opts)
        return _invisible(_boxed(gm.forward))
    except Exception as e:  # our own pipeline failed (a fuselens bug): run this graph eagerly
        if not opts.fallback_on_error:
            raise
        missing_triton = isinstance(e, ImportError) and e.name == "triton"  # an optional dependency, not a bug
        _report_fallback("compile" if missing_triton else "internal",
                         options_mod.TRITON_MISSING if missing_triton
                         else f"fuselens could not compile graph {graph_id}: {type(e).__name__}: {e}",
                         compile_id, traceback.format_exc(), opts)
        return _invisible(_boxed(gm.forward))
    for ev in events:
        sink.emit(ev)
    for phase, secs in phases:
        sink.emit(PhaseTime(phase=phase, seconds=secs, compile_id=compile_id))
    if runner.timing is not None:
        from fuselens.compiler.runtime.interpreter import register_timing

        register_timing(graph_id, runner.timing)
    runner.graph_id = graph_id  # type: ignore[attr-defined]
    return _invisible(runner)


def rewrite_graph(gm: torch.fx.GraphModule, target: str, example_inputs: Sequence[Any], stage: str) -> list:
    """The graph rewrites of graph_passes.py that apply to this target and stage."""
    from fuselens.compiler import graph_passes

    done = graph_passes.gather_through_pointwise(gm)
    done += graph_passes.reshapes_before_pointwise(gm)
    if target == "triton" and any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        done += graph_passes.pad_unaligned_matmuls(gm)
        done += graph_passes.index_put_accumulate_as_index_add(gm)
        if stage == "aot_inference":  # a forward's outputs include what its backward saves: eager's layouts there
            done += graph_passes.channels_last_convolutions(gm)
    return done


def _invisible(fn: Callable) -> Callable:
    """Hide our Python from Dynamo. A compiled training step resumes user code under
    Dynamo's frame hook, and `loss.backward()` there compiles and runs our backward
    graph: without this Dynamo would trace the compiler and the runtime themselves."""
    wrapped = torch._dynamo.disable(fn)
    try:
        wrapped._boxed_call = True  # type: ignore[attr-defined]
    except AttributeError:  # pragma: no cover
        pass
    return wrapped


def _report_fallback(kind: str, message: str, compile_id: str, tb: str, opts: Any) -> None:
    sink.emit(ErrorEntry(kind=kind, message=message + " (the graph runs eagerly)", traceback=tb, compile_id=compile_id))


def fuselens_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Optional[dict] = None,
                     mode: Optional[str] = None, **kwargs: Any) -> Callable:
    """The Dynamo backend. `options` (a dict) overrides the process-wide
    `fuselens.compiler.configure(...)` defaults for this compile; `mode` is accepted
    and ignored (there is one mode)."""
    opts = options_mod.resolve(options)
    from torch._functorch.aot_autograd import aot_module_simplified

    try:
        from torch._functorch.partitioners import min_cut_rematerialization_partition as partition
        import networkx  # noqa: F401  (min-cut needs it)
    except ImportError:  # pragma: no cover
        from torch._functorch.partitioners import default_partition as partition

    compile_id = _compile_id()
    function, location = _user_location(gm)
    start = time.perf_counter()
    if opts.extern_epilogue_fusion and _target_of(opts, example_inputs) == "triton":
        from fuselens.compiler.library_epilogues import use_library_epilogues

        use_library_epilogues(gm, example_inputs)

    def make(stage: str) -> Callable:
        def compiler(g: torch.fx.GraphModule, ins: Sequence[Any]) -> Callable:
            return compile_graph(g, ins, stage=stage, opts=opts, compile_id=compile_id, function=function,
                                 location=location, aot_start=start if stage != "aot_backward" else None)

        return _invisible(compiler)

    # DDPOptimizer (Dynamo's optimize_ddp) tells whether a bucket's backend went
    # through AOTAutograd by this counter, which only torch's own `aot_autograd`
    # helper bumps. Unbumped, it propagates shapes through the uncompiled piece
    # while AOTAutograd (asked to fakify its first call) hands fake outputs to
    # the first real call: a FakeTensor reached user code under DDP.
    from torch._dynamo.utils import counters

    counters["aot_autograd"]["total"] += 1
    table = decompositions()
    kept_whole: list[OpPairing] = []
    while True:
        seen: list[OpPairing] = []
        try:
            compiled = aot_module_simplified(
                gm,
                example_inputs,
                fw_compiler=make("aot_forward"),
                bw_compiler=make("aot_backward"),
                inference_compiler=make("aot_inference"),
                decompositions=table,
                partition_fn=checked_partition(partition, _location_of, seen),
            )
            break
        except ForwardBackwardMismatch as mismatch:
            # by name: the overload a trace records need not be the table's key object
            names = {p.forward_op for p in mismatch.pairings}
            removed = [op for op in table if str(op) in names]
            if not removed:
                raise
            for op in removed:
                del table[op]
            kept_whole.extend(mismatch.pairings)
    _report_pairings(kept_whole, seen, compile_id)
    return compiled


def _location_of(stack: str) -> Optional[SourceLocation]:
    from fuselens.compiler.explain import location_from_stack

    return location_from_stack(stack)


_KEPT_WHOLE = ("{f} runs whole in ATen in the forward too: its backward {b} reads the op's own outputs, "
               "which its decomposition does not produce (forward and backward agree)")
_ONE_DIRECTION = "{f} is decomposed and fused in the forward, but its backward {b} runs whole in ATen (one-direction fallback)"


def _report_pairings(kept_whole: list[OpPairing], one_direction: list[OpPairing], compile_id: str) -> None:
    """Findings for ops whose forward and backward were not computed alike, one per op pair."""
    said: set[tuple[str, str]] = set()
    for pairs, text in ((kept_whole, _KEPT_WHOLE), (one_direction, _ONE_DIRECTION)):
        for p in pairs:
            if (p.forward_op, p.backward_op) in said:
                continue
            said.add((p.forward_op, p.backward_op))
            sink.emit(ErrorEntry(kind="fallback", location=p.location, compile_id=compile_id,
                                 message=text.format(f=p.forward_op, b=p.backward_op)))


def _target_of(opts: Any, example_inputs: Sequence[Any]) -> str:
    from fuselens.compiler.codegen import resolve_target

    try:
        return resolve_target(opts.target, example_inputs)
    except Exception:  # noqa: BLE001 - compile_graph reports an unusable target
        return ""


def register() -> None:
    """Make `torch.compile(backend="fuselens")` work after `import fuselens.compiler`.

    When Dynamo found our `torch_dynamo_backends` entry point first it registers the
    loaded function itself (and asserts on a duplicate), so we only register when
    neither a compiler function nor an entry point is known under our name."""
    try:
        from torch._dynamo.backends import registry
    except ImportError:  # pragma: no cover
        return
    fns = getattr(registry, "_COMPILER_FNS", None)
    backends = getattr(registry, "_BACKENDS", {})
    if fns is not None and "fuselens" in fns:
        return
    if backends.get("fuselens") is not None:  # an entry point Dynamo is loading/will load
        return
    registry.register_backend(compiler_fn=fuselens_backend, name="fuselens")
