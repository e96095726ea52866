"""OpInfo gradients for CI: forward+backward compiled with `backend="fuselens"`,
every input's gradient compared with eager (benchmarks/opinfo_grad.py).

The subset covers every lowering family (pointwise, reductions, views,
indexing, norms, losses, attention, scatter, convolutions, softmax, matmul) on
the C++ target in float32 (and float64 for a few ops), and a smaller set on
the Triton target in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors).
A wrong gradient, a wrong forward, or a graph the compiler gave up on (and ran
eagerly) fails its op; ops the compiler sends to ATen pass when the gradients
are right. The full run over all autograd ops is `python -m benchmarks.opinfo
--grad`.

Cases run in worker subprocesses (benchmarks/opinfo.py) so a crash in
generated code fails the ops it hit instead of killing pytest. The self-tests
at the end prove the comparison can fail: a backend whose backward is off by
1e-3 and a graph that falls back to eager are both caught.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import opinfo_grad as g  # noqa: E402
from benchmarks import opinfo_harness as h  # noqa: E402
from benchmarks.opinfo import run_ops  # noqa: E402

F32, F64 = "grad_float32", "grad_float32+grad_float64"

# op -> (lowering family, dtypes). One or two ops per family at least.
CPP_SUBSET: dict[str, tuple[str, str]] = {
    "sin": ("pointwise", F64), "exp": ("pointwise", F32), "tanh": ("pointwise", F32),
    "sigmoid": ("pointwise", F32), "nn.functional.gelu": ("pointwise", F32), "nn.functional.silu": ("pointwise", F32),
    "mul": ("pointwise", F64), "div.no_rounding_mode": ("pointwise", F32), "pow": ("pointwise", F32),
    "where": ("pointwise", F32), "clamp": ("pointwise", F32), "abs": ("pointwise", F32),
    "sum": ("reductions", F64), "mean": ("reductions", F32), "amax": ("reductions", F32),
    "var": ("reductions", F32), "prod": ("reductions", F32), "logsumexp": ("reductions", F32),
    "cumsum": ("reductions", F32),
    # a forward of views alone needs no compiled backward (AOTAutograd replays views):
    # these move data, in both directions
    "flip": ("views", F32), "roll": ("views", F32), "repeat": ("views", F32), "tril": ("views", F32),
    "cat": ("views", F32),
    "__getitem__": ("indexing", F32), "index_select": ("indexing", F32), "gather": ("indexing", F32),
    "nn.functional.layer_norm": ("norms", F64), "nn.functional.group_norm": ("norms", F32),
    "nn.functional.batch_norm": ("norms", F32), "nn.functional.rms_norm": ("norms", F32),
    "nn.functional.cross_entropy": ("losses", F32), "nn.functional.nll_loss": ("losses", F32),
    "nn.functional.mse_loss": ("losses", F32), "nn.functional.binary_cross_entropy": ("losses", F32),
    "nn.functional.scaled_dot_product_attention": ("attention", F32),
    "scatter_add": ("scatter", F32), "index_add": ("scatter", F32),
    "nn.functional.conv2d": ("convolutions", F32),
    "softmax": ("softmax", F64), "log_softmax": ("softmax", F32),
    "matmul": ("matmul", F32),
}
# The Triton target in the interpreter: slow, so one sample of fewer ops, still every family.
TRITON_SUBSET: dict[str, str] = {
    # logaddexp2: its backward's 2 ** x has a 0-d base (_fl_pow once failed on it in the interpreter)
    "logaddexp2": "pointwise",
    "sin": "pointwise", "mul": "pointwise", "logsumexp": "reductions", "amax": "reductions", "tril": "views",
    "gather": "indexing", "nn.functional.layer_norm": "norms",
    # renorm: its backward takes a float64 sqrt (tl.sqrt_rn, float32 only, once printed for it)
    "renorm": "norms", "nn.functional.cross_entropy": "losses",
    "nn.functional.scaled_dot_product_attention": "attention", "index_add": "scatter",
    "nn.functional.conv2d": "convolutions", "softmax": "softmax",
}
FAMILIES = {"pointwise", "reductions", "views", "indexing", "norms", "losses", "attention", "scatter", "convolutions"}
BACKEND = os.environ.get("FUSELENS_TEST_BACKEND", "fuselens")


def _args(max_samples: int, options: str) -> argparse.Namespace:
    return argparse.Namespace(backend=BACKEND, variants=F32, max_samples=max_samples, max_samples_mutating=1,
                              case_timeout=180, threads=0, options=options, dynamic=False)


def _by_op(records: list[dict]) -> dict[str, list[dict]]:
    by_op: dict[str, list[dict]] = collections.defaultdict(list)
    for rec in records:
        by_op[rec["op"]].append(rec)
    return by_op


@pytest.fixture(scope="module")
def cpp_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("grad_cpp")
    specs = [f"{op}:{dtypes}" for op, (_, dtypes) in CPP_SUBSET.items()]
    return _by_op(run_ops(specs, _args(1, '{"target": "cpp"}'), tmp / "results.jsonl", tmp / "worker.log"))


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    pytest.importorskip("triton")
    tmp = tmp_path_factory.mktemp("grad_triton")
    # The interpreter must be chosen before triton is imported: a fresh worker process.
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    specs = [f"{op}:{F32}" for op in TRITON_SUBSET]
    return _by_op(run_ops(specs, _args(1, '{"target": "triton"}'), tmp / "results.jsonl", tmp / "worker.log", env))


def _assert_op_gradients_match(records: list[dict], op: str) -> None:
    assert records, f"no case ran for {op} (see the worker log)"
    failures = [r for r in records if r["status"] == "fail"]
    assert not failures, "\n".join(
        f"{r['variant']} sample {r['sample']} ({r['sample_desc']}): {r['category']}\n{r['detail']}" for r in failures
    )
    # Only ops whose forward and backward both reach the compiler are in the
    # subset: a case that compiled no backward graph tested nothing.
    assert any(r["status"] == "pass" for r in records), [(r["status"], r["category"]) for r in records]


@pytest.mark.parametrize("op", sorted(CPP_SUBSET))
def test_opinfo_gradients_on_cpp_target_match_eager(op: str, cpp_results: dict[str, list[dict]]) -> None:
    _assert_op_gradients_match(cpp_results.get(op, []), op)


@pytest.mark.parametrize("op", sorted(TRITON_SUBSET))
def test_opinfo_gradients_on_triton_interpreter_match_eager(op: str, triton_results: dict[str, list[dict]]) -> None:
    records = triton_results.get(op, [])
    _assert_op_gradients_match(records, op)
    # the backward ran in Triton kernels, not all in ATen (convolution's backward is one library call)
    if TRITON_SUBSET[op] not in ("convolutions", "attention"):
        assert sum(r["backward"]["lowered"] for r in records) > 0, records


def test_subsets_cover_every_lowering_family() -> None:
    assert FAMILIES <= {family for family, _ in CPP_SUBSET.values()}
    assert FAMILIES <= set(TRITON_SUBSET.values())


def test_cpp_backward_graphs_run_mostly_in_generated_kernels(cpp_results: dict[str, list[dict]]) -> None:
    records = [r for rs in cpp_results.values() for r in rs]
    lowered = sum(r["backward"]["lowered"] for r in records)
    extern = sum(r["backward"]["extern"] for r in records)
    assert lowered > 2 * extern, (lowered, extern)


# ---- harness self-tests: the gradient comparison can fail -----------------------------


def _op(name: str) -> Any:
    return next(op for op in g.grad_ops() if h.full_name(op) == name)


def _first_grad_sample(op: Any) -> Any:
    return g.grad_samples(op, torch.float32, 1)[0][1]


def _backward_off_by(delta: float) -> Callable:
    """A real AOTAutograd backend (no compiler) whose backward adds `delta` to every gradient."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import default_partition

    def forward(gm: torch.fx.GraphModule, _: Any) -> Callable:
        return gm

    def backward(gm: torch.fx.GraphModule, _: Any) -> Callable:
        def run(*args: Any) -> Any:
            return [o + delta if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in gm(*args)]

        return run

    def backend(gm: torch.fx.GraphModule, example_inputs: list, **_: Any) -> Callable:
        return aot_module_simplified(gm, example_inputs, fw_compiler=forward, bw_compiler=backward,
                                     partition_fn=default_partition)

    return backend


def test_grad_harness_catches_a_backward_off_by_1e_3() -> None:
    op = _op("sin")
    res = g.run_grad_case(op, 0, _first_grad_sample(op), F32, _backward_off_by(1e-3), upstream_check=False)
    assert (res.status, res.category) == ("fail", "gradient value mismatch"), res
    # and the same backend with an exact backward passes: the failure is the offset
    res = g.run_grad_case(op, 0, _first_grad_sample(op), F32, _backward_off_by(0.0), upstream_check=False)
    assert res.status == "pass", res


def test_grad_harness_fails_a_graph_that_fell_back_to_eager(tmp_path: Path) -> None:
    # A C++ compiler that always fails (and an empty kernel cache): fuselens runs
    # the graphs eagerly (right gradients) and says so with an ErrorEntry; the
    # case must still fail.
    op = _op("sin")
    res = g.run_grad_case(op, 0, _first_grad_sample(op), F32, "fuselens",
                          options={"target": "cpp", "cxx": "false", "cache_dir": str(tmp_path)})
    assert (res.status, res.category) == ("fail", "graph fallback"), res


def test_backward_accounting_counts_only_backward_graphs() -> None:
    op = _op("nn.functional.layer_norm")
    res = g.run_grad_case(op, 0, _first_grad_sample(op), F32, "fuselens", options={"target": "cpp"})
    assert res.status == "pass", res
    assert 0 < res.backward.lowered < res.nodes.lowered
