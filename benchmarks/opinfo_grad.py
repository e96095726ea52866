"""OpInfo with gradients: compile forward+backward and compare every input's gradient.

One *grad case* is one OpInfo entry, one dtype (float32, float64) and one of
its autograd samples (`op.sample_inputs(..., requires_grad=True)`: OpInfo
marks which tensors are differentiable). `run_grad_case`:

1. eager, twice, under two RNG seeds: outputs (after the sample's
   `output_process_fn_grad`), then `torch.autograd.grad` of every
   differentiable output against a fixed random cotangent (seeded by its
   size), w.r.t. every leaf that requires grad. Results that differ between
   the two runs are random or nondeterministic: not comparable (skip).
2. the same through `torch.compile(fn, backend=...)` on fresh leaves, with the
   compiler's events collected over forward *and* backward (AOTAutograd
   compiles the backward graph at the first backward call).
3. outputs and each leaf's gradient compared (`compare`) at the op's tolerance
   (`grad_tolerance`).

Statuses are those of `opinfo_harness` (pass, fail, not_compiled, upstream,
skip), plus: a graph that fell back to eager inside the compiler (ErrorEntry
`compile` or `internal`) fails with category `graph fallback`, even with the
right gradients: the compiler did not compile it. `CaseResult.backward` holds
the node accounting of the backward graphs alone (stage `aot_backward`).
"""

from __future__ import annotations

import signal
import time
import traceback
import types
import warnings
from typing import Any, Callable, Optional

import torch
import torch.utils._pytree as pytree

from benchmarks import opinfo_harness as h
from fuselens import sink
from fuselens.events import CompiledGraph, ErrorEntry, Kernel

GRAD_DTYPES = {"grad_float32": torch.float32, "grad_float64": torch.float64}

# Baselines before OpInfo's own overrides: float32 as the forward harness
# (fused kernels reduce in another order than ATen); float64 torch's defaults.
BASE_TOLERANCE = {torch.float32: h.Tolerance(1e-5, 1e-5), torch.float64: h.Tolerance(1e-7, 1e-7)}


def opinfo_tolerance(op: Any, dtype: torch.dtype) -> Optional[h.Tolerance]:
    """The loosest `toleranceOverride` the OpInfo entry declares for `dtype`
    (in any of its test decorators), or None. These are torch's own judgement
    of how far a correct implementation of the op may drift in that dtype."""
    found: Optional[h.Tolerance] = None
    for info in getattr(op, "decorators", ()) or ():
        for dec in getattr(info, "decorators", ()) or ():
            tol = getattr(dec, "d", {}).get(dtype) if isinstance(getattr(dec, "d", None), dict) else None
            if tol is None:
                continue
            # toleranceOverride holds (atol, rtol); precisionOverride an absolute precision alone
            rtol, atol = (0.0, float(tol)) if isinstance(tol, (int, float)) else (tol.rtol, tol.atol)
            found = h.Tolerance(max(rtol, found.rtol if found else 0.0), max(atol, found.atol if found else 0.0))
    return found


def grad_tolerance(op: Any, dtype: torch.dtype) -> h.Tolerance:
    """Base tolerance of the dtype, the harness's per-op override (float32) and
    OpInfo's own override, whichever is loosest in each of rtol and atol."""
    candidates = [BASE_TOLERANCE[dtype]]
    if dtype == torch.float32:
        candidates.append(h.tolerance_for(h.full_name(op)))
    own = opinfo_tolerance(op, dtype)
    if own is not None:
        candidates.append(own)
    return h.Tolerance(max(t.rtol for t in candidates), max(t.atol for t in candidates))


def grad_ops() -> list[Any]:
    """OpInfo entries that support autograd in float32 on CPU."""
    return [op for op in h.float32_cpu_ops() if op.supports_autograd]


def grad_samples(op: Any, dtype: torch.dtype, max_samples: Optional[int]) -> list[tuple[int, Any]]:
    """The op's autograd samples in `dtype` (evenly picked)."""
    if dtype not in op.supported_backward_dtypes("cpu") or not op.supports_dtype(dtype, "cpu"):
        return []
    torch.manual_seed(0)  # sample generators draw random data
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=True))
    return h.pick_samples(samples, max_samples)


def _leaf_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fresh leaves with the originals' values, layout and requires_grad."""
    return [h._clone(t.detach()).requires_grad_(t.requires_grad) for t in tensors]


def cotangent(out: torch.Tensor) -> torch.Tensor:
    """A fixed random grad_output for `out`: seeded by its size so eager and
    compiled runs (and reruns) use the same one."""
    gen = torch.Generator().manual_seed(1000 + out.numel())
    return torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype)


def differentiable(leaves: list[Any]) -> list[torch.Tensor]:
    return [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()]


def forward_backward(fn: Callable, tensors: list[torch.Tensor], post: Callable,
                     seed: int = 0) -> Optional[tuple[Any, list[torch.Tensor]]]:
    """(outputs detached, gradient of every grad-requiring input); None when no
    output is differentiable."""
    leaves = _leaf_copies(tensors)
    torch.manual_seed(seed)
    outs = post(fn(*leaves))
    flat = differentiable(pytree.tree_leaves(outs))
    wrt = [t for t in leaves if t.requires_grad]
    if not flat or not wrt:
        return None
    grads = torch.autograd.grad(flat, wrt, [cotangent(o) for o in flat], allow_unused=True, materialize_grads=True)
    detached = pytree.tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, outs)
    return detached, list(grads)


def backward_accounting(events: list[Any]) -> h.NodeAccounting:
    """`account_nodes` over the backward graphs only."""
    ids = {e.graph_id for e in events if isinstance(e, CompiledGraph) and e.stage == "aot_backward"}
    mine = [e for e in events if (isinstance(e, CompiledGraph) and e.graph_id in ids)
            or (isinstance(e, Kernel) and e.graph_id in ids)]
    return h.account_nodes(mine)


def graph_fallbacks(events: list[Any]) -> list[str]:
    """Messages of graphs the compiler gave up on and ran eagerly."""
    return [h._first_lines(e.message, 2, 300) for e in events if isinstance(e, ErrorEntry)
            and e.kind in ("compile", "internal")]


def _compiled_grads(fn: Callable, tensors: list[torch.Tensor], post: Callable, backend: Any,
                    options: Optional[dict]) -> tuple[Any, Optional[h.CountingBackend], list[Any]]:
    """Outputs and gradients through torch.compile (fresh Dynamo cache), the
    counting wrapper of a named backend (None for a backend function), and the
    compiler's events over forward and backward."""
    torch._dynamo.reset()
    counting = h.CountingBackend(backend) if isinstance(backend, str) else None
    kwargs: dict[str, Any] = {"backend": counting or backend, "dynamic": False}
    if options:
        kwargs["options"] = options
    with sink.collect() as events:
        got = forward_backward(torch.compile(fn, **kwargs), tensors, post)
    return got, counting, events


def compare_grads(expected: tuple[Any, list], actual: Optional[tuple[Any, list]], tol: h.Tolerance) -> Optional[tuple[str, str]]:
    """None when outputs and every gradient match, else (category, detail)."""
    if actual is None:
        return "no gradient", "compiled outputs are not differentiable"
    bad = h.compare(expected[0], actual[0], tol)
    if bad is not None:
        return f"forward {bad[0]}", bad[1]
    for i, (e, a) in enumerate(zip(expected[1], actual[1])):
        bad = h.compare(e, a, tol)
        if bad is not None:
            # only values matter for a gradient: autograd may hand back any layout
            if bad[0] == "stride mismatch":
                continue
            return f"gradient {bad[0]}", f"gradient of input {i}: {bad[1]}"
    return None


def unseeded(fn: Callable) -> Callable:
    """`fn` without OpInfo's `wrapper_set_seed`: some entries (SDPA, dropout,
    multi_head_attention_forward) call `torch.manual_seed` inside the op, where
    Dynamo graph-breaks and the backend sees nothing. The copy calls the op
    directly (the module's own function is left alone); `forward_backward`
    seeds before every call instead."""
    code = getattr(fn, "__code__", None)
    if code is None or "wrapper_set_seed" not in code.co_names:
        return fn
    scope = dict(fn.__globals__, wrapper_set_seed=lambda f, *args, **kwargs: f(*args, **kwargs))
    return types.FunctionType(code, scope, fn.__name__, fn.__defaults__, fn.__closure__)


def _sample_parts(op: Any, sample: Any) -> tuple[Callable, list[torch.Tensor], Callable]:
    built = h.build_case(op, sample, "fn", unseeded(op.op))
    assert built is not None  # the fn variant always applies
    fn, tensors = built
    post = getattr(sample, "output_process_fn_grad", None) or (lambda x: x)
    return fn, tensors, post


def run_grad_case(op: Any, sample_index: int, sample: Any, variant: str, backend: Any, *,
                  options: Optional[dict] = None, timeout_s: int = 0, upstream_check: bool = True) -> h.CaseResult:
    """Run one grad case (see the module docstring). `variant` is a key of GRAD_DTYPES."""
    dtype = GRAD_DTYPES[variant]
    name = h.full_name(op)
    result = h.CaseResult(op=name, variant=variant, sample=sample_index, status="pass",
                          sample_desc=h.describe_sample(sample))
    fn, tensors, post = _sample_parts(op, sample)
    reason = h.skip_reason(op)
    if any(t.layout != torch.strided for t in tensors):
        reason = "sparse input"
    elif not any(t.requires_grad for t in tensors):
        reason = "no differentiable input"
    if reason:
        result.status, result.category = "skip", reason
        return result
    tol = grad_tolerance(op, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ref = forward_backward(fn, tensors, post)
            # another seed: a result that changes is random (or not deterministic) and not comparable
            again = forward_backward(fn, tensors, post, seed=1)
        except Exception as exc:  # the sample is not differentiable in eager
            result.status, result.category = "skip", "eager backward raises"
            result.detail = h._first_lines(f"{type(exc).__name__}: {exc}", 2)
            return result
        if ref is None:
            result.status, result.category = "skip", "no differentiable output"
            return result
        if compare_grads(ref, again, tol) is not None:
            result.status, result.category = "skip", "random or nondeterministic in eager"
            return result
        problem, counting, events = _timed_compiled_case(result, fn, tensors, post, backend, options, ref, tol, timeout_s)
    return _finish(result, problem, counting, events, op, sample, variant, timeout_s, upstream_check)


def _timed_compiled_case(result: h.CaseResult, fn: Callable, tensors: list, post: Callable, backend: Any,
                         options: Optional[dict], ref: Any, tol: h.Tolerance, timeout_s: int) -> tuple:
    old_handler = signal.signal(signal.SIGALRM, h._alarm) if timeout_s else None
    if timeout_s:
        signal.alarm(timeout_s)
    start = time.perf_counter()
    counting, events = None, []
    try:
        got, counting, events = _compiled_grads(fn, tensors, post, backend, options)
        problem = compare_grads(ref, got, tol)
    except Exception as exc:
        where = "\n".join(traceback.format_exc().splitlines()[-5:-1])
        problem = (h._classify_exception(exc), h._first_lines(f"{type(exc).__name__}: {exc}", 8) + "\n" + where)
    finally:
        result.seconds = time.perf_counter() - start
        if timeout_s:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old_handler)
    return problem, counting, events


def _finish(result: h.CaseResult, problem: Optional[tuple[str, str]], counting: Any, events: list, op: Any,
            sample: Any, variant: str, timeout_s: int, upstream_check: bool) -> h.CaseResult:
    if counting is not None:
        result.graphs = counting.graphs
        result.backend_ops = sorted(set(counting.ops))
    result.nodes = h.account_nodes(events)
    result.backward = backward_accounting(events)
    fell_back = graph_fallbacks(events)
    if problem is None and fell_back:
        problem = ("graph fallback", fell_back[0])
    if problem is None:
        has_backward = any(isinstance(e, CompiledGraph) and e.stage == "aot_backward" for e in events)
        if counting is not None and not result.graphs:
            result.status, result.category = "not_compiled", "backend saw no graph (Dynamo graph break)"
        elif counting is not None and not has_backward:
            # e.g. a forward of views alone: AOTAutograd replays views in eager autograd
            result.status, result.category = "not_compiled", "forward compiled, no backward graph"
        return result
    result.status, (result.category, result.detail) = "fail", problem
    if problem[0].startswith("dynamo "):
        result.status = "upstream"
    elif upstream_check and problem[0] != "graph fallback":
        baseline = run_grad_case(op, result.sample, sample, variant, "aot_eager", timeout_s=timeout_s,
                                 upstream_check=False)
        if baseline.status in ("fail", "upstream"):
            result.status = "upstream"
            result.detail = f"aot_eager also fails ({baseline.category}): {result.detail}"
    return result
