"""Entry: `torch.compile(fn, backend="fuselens", options={...})`.

Dynamo hands us an FX graph of torch calls; AOTAutograd (`aot_module_simplified`)
functionalizes it, applies our decompositions and, when gradients are needed,
splits it into forward and backward graphs with the min-cut rematerialization
partitioner (the one Inductor uses; falls back to the default partitioner where
networkx is missing). Each resulting graph goes through our pipeline:

    graph rewrites -> lowering -> inlining -> scheduling -> codegen -> build -> runtime plan
    -> finalize -> events

with what differs between C++ and Triton behind a `Target` (targets/).

Decompositions: torch's core ATen table (`torch._decomp.core_aten_decompositions`),
plus the composite ops we would rather fuse as their parts than call whole:
native_layer_norm, _softmax, _log_softmax, gelu, batch norm (functional and
inference), group norm, hardtanh, leaky_relu, elu, var_mean/var, linalg_vector_norm
and native_dropout; a cat of one tensor with itself as a repeat (the backward recomputes
it), and repeat as one copy of an expand. mm/addmm/bmm/convolution/SDPA stay whole
(library calls).

Compile errors of a graph fall back to running that graph eagerly, with an
ErrorEntry naming the kernel; restart exceptions of Dynamo are never caught.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from fuselens import sink
from fuselens.compiler import aot_printouts, compile_gc, layout_passes, options as options_mod, untraceable_split
from fuselens.compiler.autograd_consistency import ForwardBackwardMismatch, OpPairing, checked_partition
from fuselens.compiler.joint_cse import partition_without_its_cse
from fuselens.compiler.runtime.cpp_build import KernelCompileError
from fuselens.compiler.phases import CompilePhases
from fuselens.compiler.targets.base import runs_on_cuda, with_graph_device
from fuselens.events import ErrorEntry, FusionDecision, SourceLocation
from fuselens.kernel_timing import KernelTimer, clock_for

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
        # gathers at computed positions and comparisons, which are generated (Inductor decomposes
        # them too); the first two keep their backwards whole
        aten.grid_sampler_2d, aten._adaptive_avg_pool2d, aten.bucketize,
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
    table[aten.max_pool2d_with_indices.default] = _max_pool2d_saving_window_places
    for op in (aten.max_pool2d_with_indices_backward.default, aten.avg_pool2d_backward.default,
               aten.max_pool3d_with_indices_backward.default, aten.avg_pool3d_backward.default):
        table[op] = _pool_backward_reading_no_input(op)
    table[aten.convolution_backward.default] = _convolution_backward_bias_as_sum
    table[aten.cat.default] = _cat_of_one_tensor_repeated
    table[aten.repeat.default] = _repeat_as_expand_copy
    return table


def _cat_of_one_tensor_repeated(tensors: Any, dim: int = 0) -> Any:
    """cat([x, x], dim) as x repeated along dim, an expand and a copy (Inductor's joint
    graph rewrites it so). Rotary embeddings (Llama, Qwen2) concatenate their
    frequencies with themselves before cos and sin. AOTAutograd's partitioner may not
    recompute a cat in the backward, so it saved the [B, S, 64] float32 result (Llama
    training: 1 MB above Inductor's peak); a copy it recomputes from the 32 inverse
    frequencies. Only a contiguous x: eager's cat of channels-last inputs is channels-last."""
    if len(tensors) < 2 or any(t is not tensors[0] for t in tensors):
        return NotImplemented
    x = tensors[0]
    if x.dim() == 0 or not x.is_contiguous():
        return NotImplemented
    d = dim % x.dim()
    shape = list(x.shape)
    repeated = aten.expand.default(aten.unsqueeze.default(x, d), shape[:d] + [len(tensors)] + shape[d:])
    copied = aten.clone.default(repeated, memory_format=torch.contiguous_format)
    return aten.view.default(copied, shape[:d] + [len(tensors) * shape[d]] + shape[d + 1:])


def _repeat_as_expand_copy(x: torch.Tensor, repeats: Any) -> Any:
    """x.repeat(r0, r1, ...) as one copy: x viewed with a dim of one before each of its
    dims, expanded to [r0, s0, r1, s1, ...], copied and viewed as [r0 * s0, r1 * s1, ...]
    (repeat's order: each dim's copies outermost). ATen's repeat is a kernel of its own
    between fused ones (Bloom's ALiBi slopes, einops' `repeat`, a mask tiled per head);
    the copy joins its consumers. Eager's result is contiguous whatever x's layout."""
    reps = list(repeats)
    if len(reps) < x.dim():
        return NotImplemented  # the op's own error
    shape = [1] * (len(reps) - x.dim()) + list(x.shape)
    interleaved = [1, 0] * len(shape)
    interleaved[1::2] = shape
    grown = [size for r, n in zip(reps, shape) for size in (r, n)]
    spread = aten.view.default(aten.clone.default(x, memory_format=torch.contiguous_format)
                               if not x.is_contiguous() else x, interleaved)
    copied = aten.clone.default(aten.expand.default(spread, grown), memory_format=torch.contiguous_format)
    return aten.view.default(copied, [r * n for r, n in zip(reps, shape)])


def _convolution_backward_bias_as_sum(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                                      bias_sizes: Any, stride: Any, padding: Any, dilation: Any, transposed: bool,
                                      output_padding: Any, groups: int, output_mask: Any) -> Any:
    """On the GPU, a convolution's bias gradient as a sum over the gradient (Inductor's
    decomposition): cuDNN's backward sums it in an ATen reduction and a cast of its own
    (MobileNetV3's squeeze-excitation convolutions: 32 such kernels a step), where
    ours joins the kernel that produces the gradient."""
    if not output_mask[2] or grad_output.device.type != "cuda":
        return NotImplemented
    grad_bias = aten.sum.dim_IntList(grad_output, [0, *range(2, grad_output.dim())])
    grad_input, grad_weight, _ = aten.convolution_backward.default(
        grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
        [output_mask[0], output_mask[1], False])
    return grad_input, grad_weight, grad_bias


def _max_pool2d_saving_window_places(x: torch.Tensor, kernel_size: Any, stride: Any = (), padding: Any = 0,
                                     dilation: Any = 1, ceil_mode: bool = False) -> Any:
    """max_pool2d_with_indices as the pool with each winner's place in its window (int8)
    and that place turned into the flat index (Inductor's decomposition): a training
    forward then saves int8 places for the backward, which recomputes the indices,
    instead of int64 indices (ResNet-50: 49 MB more at its peak than Inductor). Its
    outputs are the op's own, which the backward may read
    (autograd_consistency.OUTPUT_PRESERVING)."""
    from fuselens.compiler.lowering.max_pool import POOL_OFFSETS_TO_INDICES, POOL_WITH_OFFSETS, pool2d_args

    k, s, p, d = pool2d_args(kernel_size, stride, padding, dilation)
    if POOL_WITH_OFFSETS is None or x.dim() not in (3, 4) or k[0] * k[1] > torch.iinfo(torch.int8).max:
        return NotImplemented
    vals, places = POOL_WITH_OFFSETS(x, k, s, p, d, ceil_mode)
    return vals, POOL_OFFSETS_TO_INDICES(places, k, list(x.shape[-2:]), s, p, d)


def _pool_backward_reading_no_input(op: Any) -> Callable:
    """A pool's backward given a stand-in for the pool's input that has its shape and no
    data (a zero expanded): the max and average pools' (2-d and 3-d) read that input for its
    shape alone, but as their argument the partitioner saved it for the backward, where it
    recomputes it otherwise (ResNet-50's stem: its ReLU's output, 51 MB at batch 32, which
    Inductor's scatter decomposition does not save either). The result keeps eager's
    memory format."""

    def decomposition(grad_output: torch.Tensor, x: torch.Tensor, *rest: Any) -> Any:
        # the stand-in itself: the op as it is. Its strides are zero but where a dim is 1,
        # where tracing may give it any stride (max_pool1d pools a [N, C, 1, L] view)
        if x.dim() < 3 or all(st == 0 for st, n in zip(x.stride(), x.shape) if n != 1):
            return NotImplemented
        fmt = torch._prims_common.suggest_memory_format(x)
        if fmt == torch.channels_last_3d:
            return NotImplemented  # eager's 3-d pools give a contiguous gradient on the CPU: kept as they are
        shape_only = aten.expand.default(aten.zeros.default([], dtype=x.dtype, device=x.device), list(x.shape))
        out = op(grad_output, shape_only, *rest)
        return out if fmt == torch.contiguous_format else aten.clone.default(out, memory_format=fmt)

    return decomposition


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


@dataclasses.dataclass(frozen=True)
class GraphIdentity:
    """Which graph of which compile this is, for its events."""

    graph_id: str
    compile_id: str
    stage: str  # aot_forward | aot_backward | aot_inference
    function: str
    location: SourceLocation


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *, stage: str, opts: Any,
                  compile_id: str, function: str, location: SourceLocation, aot_start: Optional[float] = None) -> Callable:
    """One AOT graph through our pipeline; returns a boxed callable."""
    ident = GraphIdentity(_graph_id(compile_id, stage), compile_id, stage, function, location)
    phases = CompilePhases(compile_id)
    if aot_start is not None:
        phases.add("aot", time.perf_counter() - aot_start)
    as_traced = _graph_copy(gm) if opts.fallback_on_error else None
    try:
        with compile_gc.old_objects_frozen():  # a backward compiled at its first call
            runner, events = _compile_pipeline(gm, example_inputs, opts, ident, phases)
    except RESTARTS:
        raise
    except KernelCompileError as e:
        if not opts.fallback_on_error:
            raise
        _report_fallback("compile", str(e), compile_id, traceback.format_exc(), opts)
        _restore(gm, as_traced)
        layout_passes.report_output_strides(gm)
        return _runnable(_boxed(gm.forward))
    except Exception as e:  # our own pipeline failed (a fuselens bug): run this graph eagerly
        if not opts.fallback_on_error:
            raise
        missing_triton = isinstance(e, ImportError) and e.name == "triton"  # an optional dependency, not a bug
        _report_fallback("compile" if missing_triton else "internal",
                         options_mod.TRITON_MISSING if missing_triton
                         else f"fuselens could not compile graph {ident.graph_id}: {type(e).__name__}: {e}",
                         compile_id, traceback.format_exc(), opts)
        _restore(gm, as_traced)
        layout_passes.report_output_strides(gm)  # the graph's own, which eager computes too
        return _runnable(_boxed(gm.forward))
    layout_passes.report_output_strides(gm)
    for ev in [*events, *phases.events()]:
        sink.emit(ev)
    runner.graph_id = ident.graph_id  # type: ignore[attr-defined]
    return _runnable(runner)


def _graph_copy(gm: torch.fx.GraphModule) -> torch.fx.Graph:
    """The graph as AOTAutograd traced it, before our rewrites change it in place. fx
    copies it node by node, each node's meta dict too (a rewrite replaces a placeholder's
    value, as the layout pass does), the values in it shared: 20-30 ms for ResNet-50's
    2000-node training graphs on a 2-core machine."""
    return copy.deepcopy(gm.graph)


def _restore(gm: torch.fx.GraphModule, as_traced: Optional[torch.fx.Graph]) -> None:
    """The graph as traced again, for the fallback to run: a rewrite that failed half way
    may have left it inconsistent (a view of a tensor a layout rewrite had made
    channels-last, which eager then refused to view)."""
    if as_traced is not None:
        gm.graph = as_traced
        gm.recompile()


def _compile_pipeline(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: Any, ident: GraphIdentity,
                      phases: CompilePhases) -> tuple[Callable, list]:
    """rewrite -> lower -> inline -> order list elements, then outputs early -> schedule -> join list kernels -> generate -> build
    -> plan -> finalize -> explain;
    returns the graph's callable and its events."""
    from fuselens.compiler.combo_kernels import join_list_kernels
    from fuselens.compiler.early_outputs import outputs_early
    from fuselens.compiler.explain import build_events
    from fuselens.compiler.inline_pointwise import inline_pointwise, recompute_narrow_stores
    from fuselens.compiler.list_order import element_major
    from fuselens.compiler.lowering import lower
    from fuselens.compiler.runtime.plan import make_runner
    from fuselens.compiler.scheduler import schedule
    from fuselens.compiler.targets.registry import get_target, resolve_target

    devices = with_graph_device(gm, example_inputs)  # the device decisions' inputs, not the graph's
    target = get_target(resolve_target(opts.target, devices))
    with phases.timed("graph_passes"):
        rewrites = rewrite_graph(gm, target, example_inputs, ident.stage, opts)
        prologue, hoisted = _module_state_prologue(gm, example_inputs, ident.stage, opts)
        rewrites += hoisted
    with phases.timed("lowering"):
        graph, outputs = lower(gm, opts)
    with phases.timed("scheduling"):
        out_sources = _output_sources(graph, outputs)
        declined: dict[str, str] = {}
        inlined = inline_pointwise(graph, out_sources, costly_math=target.costly_math, declined=declined)
        element_major(graph)
        outputs_early(graph, out_sources)
        sched = schedule(graph, opts, out_sources, target.kernel_prefix)
        recomputed = (recompute_narrow_stores(graph, sched.groups, out_sources, costly_math=target.costly_math)
                      if opts.fusion else [])  # a producer recomputed in its reader is fused into it
        if recomputed:  # their readers changed: schedule them again
            inlined += recomputed
            for r in recomputed:
                declined.pop(r.node, None)
            sched = schedule(graph, opts, out_sources, target.kernel_prefix)
        if opts.combo_kernels:
            join_list_kernels(graph, sched, lambda grp: target.combo_part(grp, graph, opts), target.kernel_prefix)
    with phases.timed("codegen"):
        library = target.generate(sched.groups, graph, opts)
    with phases.timed(target.build_phase):
        lib = target.build(library, opts, ident.compile_id)
    timer = _kernel_timer(opts, ident.graph_id, devices)
    runner = make_runner(graph, sched, library.kernels, lib, outputs, timer if target.host_timing else None)
    events = build_events(gm, graph, sched, library.kernels, ident.graph_id, ident.compile_id, ident.stage,
                          ident.function, ident.location)
    events += _rewrite_decisions(rewrites, inlined, sched, ident.graph_id)
    _say_why_not_recomputed(events, declined)
    opts, blocked = _cuda_graphs_for(gm, example_inputs, opts, ident)
    runner, extra_events = target.finalize(runner, lib, opts, ident.graph_id, devices, timer)
    if prologue is not None:
        from fuselens.compiler.module_state_prologue import PrologueRunner

        runner = PrologueRunner(runner, prologue)
    return runner, events + blocked + extra_events


def _module_state_prologue(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], stage: str,
                           opts: Any) -> tuple[Any, list]:
    """An inference graph's work on module state alone, cut out to run once
    (module_state_prologue.py), where option `module_state_once` says; never under CUDA
    graphs, whose replays would not see it redone."""
    on_cuda = runs_on_cuda(example_inputs)
    if opts.module_state_once == "never" or stage != "aot_inference" \
            or (on_cuda and (opts.module_state_once == "cpu" or opts.cuda_graphs)):
        return None, []
    from fuselens.compiler.module_state_prologue import split_module_state_prologue
    from fuselens.compiler.runtime.capture_inputs import static_input_indices

    return split_module_state_prologue(gm, sorted(static_input_indices()))


def _cuda_graphs_for(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], opts: Any,
                     ident: GraphIdentity) -> tuple[Any, list]:
    """The options this graph runs with: `cuda_graphs` off, with a finding at the line
    that keeps it off, for a graph a replay could not repeat (runtime/capture_check.py)."""
    if not opts.cuda_graphs or not runs_on_cuda(example_inputs):
        return opts, []
    from fuselens.compiler.runtime.capture_check import capture_blocker

    blocker = capture_blocker(gm, example_inputs)
    if blocker is None:
        return opts, []
    return dataclasses.replace(opts, cuda_graphs=False), [ErrorEntry(
        kind="fallback", message=f"graph {ident.graph_id} runs without CUDA graphs: {blocker.reason}",
        location=_location_of(blocker.stack_trace) or ident.location,  # an input: the compiled function's line
        compile_id=ident.compile_id)]


def _kernel_timer(opts: Any, graph_id: str, example_inputs: Sequence[Any]) -> Optional[KernelTimer]:
    """The graph's kernel timer when option time_kernels is on: CUDA events for a graph
    on the GPU, else the host clock."""
    if not opts.time_kernels:
        return None
    return KernelTimer(graph_id, clock_for("cuda" if runs_on_cuda(example_inputs) else "cpu"))


def _output_sources(graph: Any, outputs: Any) -> set[str]:
    """The buffers the graph's outputs read (through views): they must reach memory."""
    from fuselens.compiler.ir import TensorValue
    from fuselens.compiler.lowering.lowerer import sources_of

    out_sources: set[str] = set()
    for o in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
        if isinstance(o, torch.fx.Node):
            v = graph.values.get(o.name)
            for tv in v if isinstance(v, tuple) else [v]:
                if isinstance(tv, TensorValue):
                    out_sources |= sources_of(tv)
    return out_sources | set(graph.input_mutations)  # stored: into the input itself, or copied there


def _rewrite_decisions(rewrites: list, inlined: list, sched: Any, graph_id: str) -> list[FusionDecision]:
    """The graph rewrites and inlined producers as fusion decisions of the report."""
    events = [FusionDecision(decision="fused" if r.applied else "not_fused", nodes=[r.node], reason=r.detail,
                             graph_id=graph_id, rule=r.rule) for r in rewrites]
    kernel_of = {n.name: grp.name for grp in sched.groups for n in grp.nodes}
    events.extend(FusionDecision(decision="fused", nodes=[i.node, *i.readers], reason=i.reason(),
                                 kernel=kernel_of.get(i.readers[0]), graph_id=graph_id, rule="inline")
                  for i in inlined)
    return events


def _say_why_not_recomputed(events: list, declined: dict[str, str]) -> None:
    """A producer and its reader kept apart because their iteration spaces differ: the
    refusal also says why the producer was not recomputed in the reader instead."""
    for i, e in enumerate(events):
        if not (isinstance(e, FusionDecision) and e.decision == "not_fused" and e.rule == "iteration-space"
                and len(e.nodes) == 2):
            continue
        producer, reader = e.nodes if e.nodes[0] in declined else reversed(e.nodes)
        if producer in declined:
            why = f"; {producer} is not recomputed inside {reader} instead: {declined[producer]}"
            events[i] = dataclasses.replace(e, reason=e.reason + why)


def rewrite_graph(gm: torch.fx.GraphModule, target: Any, example_inputs: Sequence[Any], stage: str,
                  opts: Any) -> list:
    """The graph rewrites of graph_passes.py for every target, then the target's own."""
    from fuselens.compiler import graph_passes
    from fuselens.compiler.constant_folding import fold_constants
    from fuselens.compiler.random_ops import random_in_kernels

    with _python_regenerated_once(gm):
        layout_passes.adopt_input_layouts(gm, example_inputs)
        done = graph_passes.merge_common_subexpressions(gm) if stage == "aot_inference" else []
        done += fold_constants(gm)
        if opts.lower and not opts.fallback_random:
            done += random_in_kernels(gm)
        done += graph_passes.gather_through_pointwise(gm)
        done += graph_passes.reshapes_before_pointwise(gm)
        done += graph_passes.cats_extend_earlier_cats(gm)
        return done + target.graph_rewrites(gm, example_inputs, stage)


@contextlib.contextmanager
def _python_regenerated_once(gm: torch.fx.GraphModule) -> Any:
    """Each rewrite regenerates the module's Python after changing its graph, so that it
    runs alone (as the tests run them); here the code is regenerated once, after the last
    (EfficientNet-B0's 4000-node training graph: 0.4 s each time)."""
    asked: list[bool] = []
    gm.recompile = lambda: asked.append(True)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del gm.recompile
        if asked:
            gm.recompile()


def _runnable(fn: Callable) -> Callable:
    """A compiled graph's callable as AOTAutograd gets it: hidden from Dynamo, and the
    first to run a full collection after compiles (compile_gc.collect_after_compiles)."""
    return _invisible(compile_gc.collect_after_compiles(fn))


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
    try:
        from torch._functorch.partitioners import min_cut_rematerialization_partition as partition
        import networkx  # noqa: F401  (min-cut needs it)
    except ImportError:  # pragma: no cover
        from torch._functorch.partitioners import default_partition as partition

    compile_id = _compile_id()
    function, location = _user_location(gm)
    start = time.perf_counter()
    devices = with_graph_device(gm, example_inputs)
    triton = _target_of(opts, devices) == "triton"
    if triton:
        _start_compile_workers(opts)
    if opts.extern_epilogue_fusion and triton:
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

    def aot(g: torch.fx.GraphModule, ins: Sequence[Any]) -> Callable:
        counters["aot_autograd"]["total"] += 1
        return _aot_compile(g, ins, make, partition, compile_id, opts.fallback_random,
                            backward_with_forward=triton and opts.backward_with_forward and runs_on_cuda(devices))

    with compile_gc.old_objects_frozen():
        try:
            with warnings.catch_warnings():
                # anomaly mode's "Error detected in ...Backward" for a custom op's backward that
                # cannot be traced: said better by the split's finding, or by Dynamo's break
                warnings.filterwarnings("ignore", message="Error detected in", category=UserWarning)
                return aot(gm, example_inputs)
        except RESTARTS:
            raise
        except Exception as e:
            found = untraceable_split.untraceable_backward(e)
            if found is None or not untraceable_split.can_split(gm, found):
                raise
            return untraceable_split.compile_around(gm, example_inputs, found, aot, compile_id)


def _reset() -> None:
    """What our compiled graphs hold on the device goes with `torch._dynamo.reset()` (their
    CUDA graphs' pools and static inputs), called from Dynamo's callback handler's `clear`,
    which every reset calls (`_install_dynamo_callbacks`). Not as the backend's `reset`:
    Dynamo calls that only for the backends `torch.compile` registered since the last
    reset, so a function compiled once and called across resets, compiled again unknown
    to the next, kept its graphs."""
    from fuselens.compiler.runtime.cuda_graphs import release_all

    release_all()


def _aot_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], make: Callable[[str], Callable],
                 partition: Callable, compile_id: str, eager_random: bool = False,
                 backward_with_forward: bool = False) -> Callable:
    """AOTAutograd with our decompositions; an op whose decomposed forward its
    backward cannot read (autograd_consistency.py) is kept whole and the graph traced again.
    `eager_random` (option fallback_random): dropout stays eager's own op, which draws
    eager's numbers (its decomposition draws them with rand_like, another stream).
    `backward_with_forward` (the option): AOTAutograd compiles the backward right after
    the forward (its non-lazy lowering, torch 2.11-2.13), not at the first backward."""
    from torch._functorch.aot_autograd import aot_module_simplified
    import torch._functorch.config as functorch_config

    def backward_timing() -> Any:
        if backward_with_forward and hasattr(functorch_config, "force_non_lazy_backward_lowering"):
            return functorch_config.patch(force_non_lazy_backward_lowering=True)
        return contextlib.nullcontext()

    table = decompositions()
    if eager_random:
        table.pop(aten.native_dropout.default, None)
    kept_whole: list[OpPairing] = []
    while True:
        seen: list[OpPairing] = []
        try:
            with backward_timing(), aot_printouts.skipped_when_unread():
                compiled = aot_module_simplified(
                    gm,
                    example_inputs,
                    fw_compiler=make("aot_forward"),
                    bw_compiler=make("aot_backward"),
                    inference_compiler=make("aot_inference"),
                    decompositions=table,
                    # BatchNorm's running stats and an optimizer's parameters are written by our
                    # kernels (lowering `copy_`), not copied back by AOTAutograd after the graph
                    keep_inference_input_mutations=True,
                    partition_fn=checked_partition(partition_without_its_cse(partition), _location_of, seen),
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


def _start_compile_workers(opts: Any) -> None:
    """Start the Triton compile workers for a graph that will run on CUDA, before
    AOTAutograd: they come up in seconds, and started at the first kernel compile
    they missed the process's first graph (ResNet-50 training's forward compiled its
    kernels in threads of this process)."""
    try:
        from fuselens.compiler.runtime.triton_precompile import compiles_for_cuda, start_workers

        if compiles_for_cuda():
            start_workers(opts)
    except Exception:  # noqa: BLE001 - no workers: kernels compile in this process, as before
        pass


def _start_workers_as_dynamo_starts(*_: Any) -> None:
    """A Dynamo start callback: the compile workers start as Dynamo begins tracing a
    frame, not when its first graph reaches us. A graph whose kernels are generated
    before they are up compiles them in this process, in threads that hold the GIL
    (GPT-2 training's first graph: 2.6 s, when a worker took 7-8 s to import torch);
    they now import Triton alone, and Dynamo's trace of the first frame is head start
    for that and for Triton's own setup in this process.

    Only in a process that loaded this module (it asked for `backend="fuselens"` or
    imported the compiler) and has already initialized CUDA (its model is on the
    GPU), unless the process-wide `compile_workers` option turns them off; a graph's
    own option still decides whether its kernels are sent to them."""
    from fuselens.compiler.runtime import compile_pool

    if compile_pool.get_pool(0) is not None or options_mod.current().compile_workers == 0:
        return
    try:
        if not torch.cuda.is_initialized():
            return
        _start_compile_workers(options_mod.current())
    except Exception:  # noqa: BLE001 - as _start_compile_workers: the backend starts them later
        pass


_worker_start: Any = None  # _start_workers_as_dynamo_starts as registered


def _is_ours(backend: Any) -> bool:
    return backend is fuselens_backend


def _install_dynamo_callbacks() -> None:
    """Our Dynamo start (and end) callbacks: the compile workers' early start, and the
    collector frozen while a frame of ours is traced. `torch._dynamo.reset()` clears
    every callback, to behave as a fresh process would; a fresh process that loaded
    this module has ours, so they are installed again after the handler's clear (the
    suite's cold compile is the first step after a reset), and our CUDA graphs are
    released there, the one place every reset reaches."""
    global _worker_start
    handler = getattr(getattr(torch, "_dynamo", None), "callback_handler", None)
    register_start = getattr(handler, "register_start_callback", None)
    if register_start is None:
        return
    # hidden from Dynamo: see compile_gc.freeze_while_dynamo_traces
    if _worker_start is None:
        _worker_start = torch._dynamo.disable(_start_workers_as_dynamo_starts)
    if _worker_start not in getattr(handler, "start_callbacks", []):
        register_start(_worker_start)
    compile_gc.freeze_while_dynamo_traces(handler, _is_ours, torch._dynamo.disable)
    clear = getattr(handler, "clear", None)
    if clear is not None and not getattr(clear, "keeps_fuselens_callbacks", False):
        def clear_keeping_ours() -> None:
            clear()
            _install_dynamo_callbacks()
            _reset()  # reset() clears the callbacks: the one call every reset makes

        clear_keeping_ours.keeps_fuselens_callbacks = True  # type: ignore[attr-defined]
        handler.clear = clear_keeping_ours


_install_dynamo_callbacks()


def _target_of(opts: Any, example_inputs: Sequence[Any]) -> str:
    from fuselens.compiler.targets.registry import resolve_target

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
