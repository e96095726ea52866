"""Compile PyTorch OpInfo samples with a torch.compile backend and compare to eager.

One *case* is one OpInfo entry, one variant (`fn`, `inplace`, `out`) and one
sample. `run_case` runs it eagerly twice (to catch ops that are not
deterministic in eager), then compiled through the backend under test, and
compares outputs *and* the inputs afterwards (a compiled graph must mutate
exactly what eager mutates). Failures that the same case also shows under
`aot_eager` (Dynamo + AOTAutograd, no compiler) are classified `upstream`:
they are torch's, not the compiler's.

Statuses of a case:
- `pass`: compiled result matches eager (fallbacks to ATen included).
- `fail`: wrong values/shape/dtype/strides, or the compiled call raised.
- `not_compiled`: right result, but the backend never saw a graph (Dynamo
  graph-broke on the op or traced nothing), so the compiler was not exercised.
- `upstream`: fails under `aot_eager` too.
- `skip`: not comparable (random op, eager raises, nondeterministic in eager).

The compiler's own events (`fuselens.sink`) give how many ATen nodes went into
generated kernels versus extern/fallback calls; see `NodeAccounting`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import signal
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.utils._pytree as pytree

from fuselens import sink
from fuselens.events import CompiledGraph, ErrorEntry, Kernel

# Ops whose result is random or uninitialised: comparing values is meaningless.
# Matched against OpInfo names (with the variant suffix), see `skip_reason`.
RANDOM_NAME = re.compile(
    r"^(rand|randn|randint|rand_like|randn_like|randint_like|bernoulli|multinomial|normal|uniform|"
    r"cauchy|exponential|geometric|log_normal|svd_lowrank|pca_lowrank)($|\.)"
    r"|^nn\.functional\.(rrelu|gumbel_softmax|fractional_max_pool\dd|(feature_)?(alpha_)?dropout(\dd)?)($|\.(?!without_train))"
)

# The variants a case can exercise.
VARIANTS = ("fn", "inplace", "out")


@dataclass
class Tolerance:
    rtol: float = 1e-5
    atol: float = 1e-5


# Per-op tolerance overrides, each with the reason a reviewer can check. Keys
# are OpInfo full names ("name" or "name.variant").
TOLERANCE_OVERRIDES: dict[str, tuple[Tolerance, str]] = {
    # Long float32 reductions: a blocked/vectorised accumulation order differs
    # from ATen's by a few ulp times sqrt(n).
    "std": (Tolerance(1e-4, 1e-5), "reduction order"),
    "var": (Tolerance(1e-4, 1e-5), "reduction order"),
    "std_mean": (Tolerance(1e-4, 1e-5), "reduction order"),
    "var_mean": (Tolerance(1e-4, 1e-5), "reduction order"),
    "cumprod": (Tolerance(1e-4, 1e-5), "sequential products amplify rounding"),
    "prod": (Tolerance(1e-4, 1e-5), "products amplify rounding"),
    "nn.functional.cosine_similarity": (Tolerance(1e-4, 1e-5), "reduction order"),
    "nn.functional.pdist": (Tolerance(1e-4, 1e-5), "reduction order"),
    "cdist": (Tolerance(1e-4, 1e-5), "reduction order"),
    "logsumexp": (Tolerance(2e-5, 2e-5), "reduction order"),
}


def tolerance_for(op_name: str) -> Tolerance:
    """Tolerance for an OpInfo full name, the default when not overridden."""
    if op_name in TOLERANCE_OVERRIDES:
        return TOLERANCE_OVERRIDES[op_name][0]
    base = op_name.split(".")[0]
    return TOLERANCE_OVERRIDES.get(base, (Tolerance(), ""))[0]


@dataclass
class NodeAccounting:
    """Where the ATen nodes of the compiled graphs went, from compiler events.

    `lowered`: nodes in generated (cpp/triton) kernels; `extern`: nodes run as
    extern/library/ATen-fallback calls; `no_kernel`: call nodes in no kernel
    (views folded into index maps, no-ops); `graph_fallbacks`: whole graphs
    that fell back to eager (their nodes count as extern).
    """

    lowered: int = 0
    extern: int = 0
    no_kernel: int = 0
    graph_fallbacks: int = 0
    extern_ops: list[str] = field(default_factory=list)
    fallback_reasons: list[str] = field(default_factory=list)

    def add(self, other: "NodeAccounting") -> None:
        self.lowered += other.lowered
        self.extern += other.extern
        self.no_kernel += other.no_kernel
        self.graph_fallbacks += other.graph_fallbacks
        self.extern_ops.extend(other.extern_ops)
        self.fallback_reasons.extend(other.fallback_reasons)


@dataclass
class CaseResult:
    op: str  # OpInfo full name, "name" or "name.variant_test_name"
    variant: str  # fn | inplace | out
    sample: int  # index into the op's float32 CPU samples
    status: str  # pass | fail | not_compiled | upstream | skip | crash
    category: str = ""  # short class of failure/skip, e.g. "value mismatch"
    detail: str = ""
    sample_desc: str = ""
    graphs: int = 0  # graphs the backend compiled
    backend_ops: list[str] = field(default_factory=list)  # Dynamo-level targets seen
    nodes: NodeAccounting = field(default_factory=NodeAccounting)
    seconds: float = 0.0  # compile + first call
    # grad cases (benchmarks/opinfo_grad.py): the backward graphs' share of `nodes`
    backward: NodeAccounting = field(default_factory=NodeAccounting)

    @property
    def key(self) -> str:
        return f"{self.op}|{self.variant}|{self.sample}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CaseResult":
        data = dict(data)
        data["nodes"] = NodeAccounting(**data.get("nodes", {}))
        data["backward"] = NodeAccounting(**data.get("backward", {}))
        return cls(**data)


def full_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def float32_cpu_ops() -> list[Any]:
    """OpInfo entries that support float32 on CPU."""
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if op.supports_dtype(torch.float32, "cpu")]


def skip_reason(op: Any) -> Optional[str]:
    """Why an op as a whole is not value-comparable, or None."""
    if RANDOM_NAME.search(full_name(op)):
        return "random op"
    if getattr(op, "skip_correctness_check_compile_vs_eager", False):
        return "OpInfo marks compile-vs-eager values incomparable"
    return None


def metadata_only(op: Any) -> bool:
    """Uninitialised outputs (empty, new_empty, ...): compare shape/dtype/strides only."""
    return bool(getattr(op, "has_nondeterministic_output", False))


def pick_samples(samples: list[Any], max_samples: Optional[int]) -> list[tuple[int, Any]]:
    """Evenly spaced samples (first and last included) so small budgets still
    see different shapes and argument kinds."""
    indexed = list(enumerate(samples))
    if max_samples is None or len(indexed) <= max_samples:
        return indexed
    if max_samples == 1:
        return indexed[:1]
    step = (len(indexed) - 1) / (max_samples - 1)
    picks = sorted({round(i * step) for i in range(max_samples)})
    return [indexed[i] for i in picks]


def op_samples(op: Any, max_samples: Optional[int]) -> list[tuple[int, Any]]:
    torch.manual_seed(0)  # sample generators draw random data
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    return pick_samples(samples, max_samples)


def describe_sample(sample: Any) -> str:
    """Short human description: shapes/strides of tensors, other args verbatim."""

    def one(x: Any) -> str:
        if isinstance(x, torch.Tensor):
            s = f"{x.dtype}".replace("torch.", "") + str(list(x.shape))
            if x.layout != torch.strided:
                s += f" {x.layout}".replace("torch.", "")
            elif x.dim() and not x.is_contiguous():
                s += f" stride={x.stride()}"
            return s
        if isinstance(x, (list, tuple)):
            inner = ", ".join(one(v) for v in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        return repr(x)

    parts = [one(sample.input)] + [one(a) for a in sample.args]
    parts += [f"{k}={one(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)[:300]


def _clone(t: torch.Tensor) -> torch.Tensor:
    """Copy keeping the layout (strides) of the original where possible."""
    try:
        out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(t)
        return out
    except RuntimeError:  # overlapping (expanded) inputs cannot be written
        return t.clone()


def _clone_all(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [_clone(t) for t in tensors]


def build_case(
    op: Any, sample: Any, variant: str, fn_target: Optional[Callable] = None
) -> Optional[tuple[Callable, list[torch.Tensor]]]:
    """A function of the sample's tensors calling the op variant, with every
    non-tensor argument baked in as a constant, and those tensors. None when
    the op has no such variant or the sample cannot use it. `fn_target`
    replaces `op.op` for the fn variant."""
    if variant == "fn":
        target = fn_target or op.op
    elif variant == "inplace":
        target = op.inplace_variant
        if target is None or getattr(sample, "broadcasts_input", False):
            return None
    elif variant == "out":
        if not op.supports_out:
            return None
        target = op.op
    else:
        raise ValueError(variant)

    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    constants = list(leaves)

    def case_fn(*tensors: torch.Tensor, out: Any = None) -> Any:
        filled = list(constants)
        for pos, tensor in zip(positions, tensors):
            filled[pos] = tensor
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        if out is not None:
            return target(inp, *args, **kwargs, out=out)
        return target(inp, *args, **kwargs)

    return case_fn, [leaves[i] for i in positions]


class CaseTimeout(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise CaseTimeout()


def _first_lines(text: str, n: int = 6, width: int = 400) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return "\n".join(line[:width] for line in lines[:n])


def compare(expected: Any, actual: Any, tol: Tolerance, *, values: bool = True) -> Optional[tuple[str, str]]:
    """None when `actual` matches `expected`, else (category, detail).

    Tensors must agree in shape, dtype and strides of dims longer than one, and
    values within `tol` (NaN equals NaN); other leaves must be equal."""
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    act_leaves, act_spec = pytree.tree_flatten(actual)
    if exp_spec != act_spec:
        return "structure mismatch", f"expected {exp_spec}, got {act_spec}"
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        where = f"output leaf {i}"
        if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
            return "structure mismatch", f"{where}: expected {type(e).__name__}, got {type(a).__name__}"
        if isinstance(e, torch.Tensor):
            if e.shape != a.shape:
                return "shape mismatch", f"{where}: expected {list(e.shape)}, got {list(a.shape)}"
            if e.dtype != a.dtype:
                return "dtype mismatch", f"{where}: expected {e.dtype}, got {a.dtype}"
            if e.layout != torch.strided or a.layout != torch.strided:
                if e.layout != a.layout:
                    return "layout mismatch", f"{where}: expected {e.layout}, got {a.layout}"
                e, a = e.to_dense(), a.to_dense()
            # Strides matter where a dim has more than one element: a caller
            # may .view() the result and eager's layout is the contract.
            es = [s for s, n in zip(e.stride(), e.shape) if n > 1]
            as_ = [s for s, n in zip(a.stride(), a.shape) if n > 1]
            if es != as_ and e.numel() > 1:
                return "stride mismatch", f"{where}: shape {list(e.shape)} expected strides {e.stride()}, got {a.stride()}"
            if not values:
                continue
            try:
                torch.testing.assert_close(
                    a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True, check_stride=False
                )
            except AssertionError as exc:
                return "value mismatch", f"{where}: {_first_lines(str(exc))}"
        elif isinstance(e, float) and isinstance(a, float):
            if not (math.isclose(e, a, rel_tol=tol.rtol, abs_tol=tol.atol) or (math.isnan(e) and math.isnan(a))):
                return "value mismatch", f"{where}: expected {e!r}, got {a!r}"
        elif e != a:
            return "value mismatch", f"{where}: expected {e!r}, got {a!r}"
    return None


class CountingBackend:
    """Wraps a registered backend to count the graphs (and their ops) Dynamo
    hands it. Keyword arguments (mode=, options=) pass through untouched, and
    so do torch's restart exceptions."""

    def __init__(self, name: str) -> None:
        from torch._dynamo.backends.registry import lookup_backend

        if name == "fuselens":  # registered on import: a checkout needs no installed entry point
            import fuselens.compiler  # noqa: E402
            fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
        self.name = name
        self.inner = lookup_backend(name)
        self.graphs = 0
        self.ops: list[str] = []
        self.__name__ = f"counting_{name}"

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
        compiled = self.inner(gm, example_inputs, **kwargs)
        # Counted only once compiled: a restart (e.g. TensorifyScalarRestartAnalysis
        # under dynamic=True) raises out of the backend and Dynamo calls it again.
        self.graphs += 1
        self.ops.extend(
            str(getattr(n.target, "__name__", n.target))
            for n in gm.graph.nodes
            if n.op in ("call_function", "call_method", "call_module")
        )
        return compiled


def account_nodes(events: list[Any]) -> NodeAccounting:
    """Node accounting from the compiler's events (see `NodeAccounting`).

    ATen nodes are the call nodes of the AOT graphs (stage aot_*). A node
    belongs to the kernel named in `GraphNode.kernel`, or to the Kernel event
    listing it in `nodes`. Graphs with a `compile` ErrorEntry ran eagerly."""
    acc = NodeAccounting()
    kernels = [e for e in events if isinstance(e, Kernel)]
    kind_by_name: dict[tuple[str, str], str] = {(k.graph_id, k.name): k.kind for k in kernels}
    kind_by_node: dict[tuple[str, str], str] = {}
    ops_by_node: dict[tuple[str, str], str] = {}
    for k in kernels:
        for node in k.nodes:
            kind_by_node[(k.graph_id, node)] = k.kind
        if k.kind == "extern" and not k.nodes:
            acc.extern_ops.extend(k.ops)
    errors = [e for e in events if isinstance(e, ErrorEntry)]
    failed_compiles = {e.compile_id for e in errors if e.kind == "compile"}
    acc.graph_fallbacks = len([e for e in errors if e.kind == "compile"])
    acc.fallback_reasons = [_first_lines(e.message, 1, 200) for e in errors if e.kind in ("compile", "fallback")]
    graphs = [e for e in events if isinstance(e, CompiledGraph) and e.stage != "dynamo"]
    for g in graphs:
        gid = g.graph_id or f"{g.compile_id}:{g.stage}"
        for n in g.nodes:
            if n.op != "call_function":
                continue
            ops_by_node[(gid, n.name)] = n.target
            if g.compile_id in failed_compiles:
                kind = "extern"
            elif n.kernel is not None and (gid, n.kernel) in kind_by_name:
                kind = kind_by_name[(gid, n.kernel)]
            else:
                kind = kind_by_node.get((gid, n.name), "")
            if kind == "extern":
                acc.extern += 1
                acc.extern_ops.append(n.target)
            elif kind in ("cpp", "triton"):
                acc.lowered += 1
            else:
                acc.no_kernel += 1
    return acc


def _observe(fn: Callable, tensors: list[torch.Tensor], out: Any) -> Any:
    """Output and the inputs afterwards (mutations are part of the result)."""
    if out is not None:
        result = fn(*tensors, out=out)
        return (result, out, tensors)
    return (fn(*tensors), tensors)


def _alloc_out(ref_output: Any) -> Any:
    """Fresh out= buffers like eager's outputs; None when unsupported shape of output."""
    if isinstance(ref_output, torch.Tensor):
        return torch.empty_like(ref_output)
    if isinstance(ref_output, tuple) and all(isinstance(t, torch.Tensor) for t in ref_output):
        return tuple(torch.empty_like(t) for t in ref_output)
    return None


def _compiled_run(
    fn: Callable, tensors: list[torch.Tensor], out: Any, backend: str, options: Optional[dict], dynamic: Optional[bool]
) -> tuple[Any, CountingBackend, list[Any]]:
    """Run once through torch.compile with a fresh Dynamo cache; return the
    observation, the counting backend and the events emitted meanwhile."""
    torch._dynamo.reset()
    counting = CountingBackend(backend)
    kwargs: dict[str, Any] = {"backend": counting, "dynamic": dynamic}
    if options:
        kwargs["options"] = options
    compiled = torch.compile(fn, **kwargs)
    with sink.collect() as events:
        observed = _observe(compiled, tensors, out)
    return observed, counting, events


def _classify_exception(exc: BaseException) -> str:
    name = type(exc).__name__
    if isinstance(exc, CaseTimeout):
        return "timeout"
    if name == "BackendCompilerFailed":
        return "compile error"
    if name in ("Unsupported", "UserError", "InternalTorchDynamoError", "TorchRuntimeError"):
        return f"dynamo {name}"
    return "runtime error"


def run_case(
    op: Any,
    sample_index: int,
    sample: Any,
    variant: str,
    backend: str,
    *,
    options: Optional[dict] = None,
    dynamic: Optional[bool] = False,
    timeout_s: int = 0,
    upstream_check: bool = True,
) -> Optional[CaseResult]:
    """Run one case (see the module docstring); None when the op has no such
    variant for this sample."""
    built = build_case(op, sample, variant)
    if built is None:
        return None
    fn, tensors = built
    name = full_name(op)
    result = CaseResult(op=name, variant=variant, sample=sample_index, status="pass", sample_desc=describe_sample(sample))
    reason = skip_reason(op)
    if any(t.layout != torch.strided for t in tensors):
        reason = "sparse input (the compiler handles dense tensors; Dynamo/AOT sparse support is torch's)"
    if reason:
        result.status, result.category = "skip", reason
        return result
    tol = tolerance_for(name)
    values = not metadata_only(op)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ref = _observe(fn, _clone_all(tensors), None)
            out = _alloc_out(ref[0]) if variant == "out" else None
            if variant == "out":
                if out is None:
                    return None
                ref = _observe(fn, _clone_all(tensors), _alloc_out(ref[0]))
            again = _observe(fn, _clone_all(tensors), _alloc_out(ref[0]) if variant == "out" else None)
        except Exception as exc:  # the sample is invalid for this variant
            result.status, result.category = "skip", "eager raises"
            result.detail = _first_lines(f"{type(exc).__name__}: {exc}", 2)
            return result
        if values and compare(ref, again, tol) is not None:
            result.status, result.category = "skip", "nondeterministic in eager"
            return result

        old_handler = None
        if timeout_s:
            old_handler = signal.signal(signal.SIGALRM, _alarm)
            signal.alarm(timeout_s)
        start = time.perf_counter()
        try:
            fresh_out = _alloc_out(ref[0]) if out is not None else None
            observed, counting, events = _compiled_run(fn, _clone_all(tensors), fresh_out, backend, options, dynamic)
            problem = compare(ref, observed, tol, values=values)
        except Exception as exc:
            counting, events = None, []
            # The message head says what; the innermost frames say where.
            where = "\n".join(traceback.format_exc().splitlines()[-5:-1])
            problem = (_classify_exception(exc), _first_lines(f"{type(exc).__name__}: {exc}", 8) + "\n" + where)
        finally:
            result.seconds = time.perf_counter() - start
            if timeout_s:
                signal.alarm(0)
                signal.signal(signal.SIGALRM, old_handler)

    if counting is not None:
        result.graphs = counting.graphs
        result.backend_ops = sorted(set(counting.ops))
    result.nodes = account_nodes(events)
    if problem is None:
        result.status = "pass" if result.graphs else "not_compiled"
        result.category = "" if result.graphs else "backend saw no graph"
        return result
    result.status, (result.category, result.detail) = "fail", problem
    if problem[0].startswith("dynamo "):
        result.status = "upstream"
    elif upstream_check and backend not in ("eager", "aot_eager"):
        baseline = run_case(
            op, sample_index, sample, variant, "aot_eager", dynamic=dynamic, timeout_s=timeout_s, upstream_check=False
        )
        if baseline is not None and baseline.status in ("fail", "upstream"):
            result.status = "upstream"
            result.detail = f"aot_eager also fails ({baseline.category}): {result.detail}"
    return result


def iter_cases(
    ops: list[Any], variants: tuple[str, ...], max_samples: Optional[int]
) -> Iterator[tuple[Any, int, Any, str]]:
    """(op, sample index, sample, variant) for every selected case."""
    for op in ops:
        try:
            samples = op_samples(op, max_samples)
        except Exception:  # a broken sample generator is not our business
            continue
        for variant in variants:
            for index, sample in samples:
                yield op, index, sample, variant


BF16_TOL = Tolerance(1.6e-2, 1e-2)  # torch's own bfloat16 defaults


def dtype_cases(device: str, dtypes: Sequence[torch.dtype], names: Optional[set], max_samples: Optional[int]) -> list[dict]:
    """The function variant of every OpInfo op in `names` (None: all), on `device`
    in each of `dtypes`, compiled with fuselens and compared with eager on the same
    device and dtype: one record per sample (op, dtype, ok, why, node accounting)."""
    from torch.testing._internal.common_methods_invocations import op_db

    from fuselens.events import Kernel

    out: list[dict] = []
    for op in op_db:
        name = full_name(op)
        if names is not None and name not in names:
            continue
        if names is None and skip_reason(op) is not None:
            continue
        for dtype in dtypes:
            if not op.supports_dtype(dtype, device):
                continue
            try:
                samples = list(op.sample_inputs(device, dtype, requires_grad=False))
            except Exception as e:  # noqa: BLE001
                out.append({"op": name, "dtype": str(dtype), "ok": False, "why": f"samples: {e}"})
                continue
            for si, sample in pick_samples(samples, max_samples):
                built = build_case(op, sample, "fn")
                if built is None:
                    continue
                fn, tensors = built
                rec: dict[str, Any] = {"op": name, "dtype": str(dtype).replace("torch.", ""), "sample": si}
                try:
                    expected = _observe(fn, _clone_all(tensors), None)  # (output, inputs afterwards)
                except Exception:  # noqa: BLE001 - eager refuses the sample: not a case
                    continue
                try:
                    actual, counting, events = _compiled_run(fn, _clone_all(tensors), None, "fuselens", None, None)
                    tol = tolerance_for(name) if dtype == torch.float32 else BF16_TOL
                    bad = compare(expected, actual, tol, values=not metadata_only(op))
                    if bad is not None:  # torch's own (Dynamo's graph, AOT) when aot_eager is off too
                        try:
                            ref, _, _ = _compiled_run(fn, _clone_all(tensors), None, "aot_eager", None, None)
                            rec["upstream"] = compare(expected, ref, tol, values=not metadata_only(op)) is not None
                        except Exception:  # noqa: BLE001 - no reference: count it as ours
                            rec["upstream"] = False
                    acc = account_nodes(events)
                    rec.update(ok=bad is None, why=" ".join(bad) if bad else "", lowered=acc.lowered, extern=acc.extern,
                               graph_fallbacks=acc.graph_fallbacks, reasons=acc.fallback_reasons[:2],
                               kernels=sum(1 for e in events if isinstance(e, Kernel)),
                               triton=sum(1 for e in events if isinstance(e, Kernel) and e.kind == "triton"))
                except Exception as e:  # noqa: BLE001
                    rec.update(ok=False, why=f"{type(e).__name__}: {str(e)[:300]}")
                out.append(rec)
    return out
