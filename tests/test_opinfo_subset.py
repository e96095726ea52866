"""OpInfo correctness subset for CI: ~40 representative ops through the
compiler backend, 2 samples each, compared to eager (values, dtypes, shapes,
strides, and inputs mutated exactly as eager mutates them).

A wrong result fails its op's test; ops the compiler hands to ATen pass as
long as the result is right. The same ops run once more in bfloat16 on the C++
target (benchmarks/opinfo_bf16.py), at torch's bfloat16 tolerances. The full run over every OpInfo op is
`python -m benchmarks.opinfo` (see benchmarks/opinfo.py).

The cases run in one worker subprocess (benchmarks/opinfo.py) so a crash in
generated code fails the ops it hit instead of killing pytest. The backend is
`fuselens` unless FUSELENS_TEST_BACKEND names another.

The harness self-tests at the end prove that the comparison can fail: a
backend that is off by 1e-3, one that returns wrong strides and one that
drops an input mutation are all caught.
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

from benchmarks import opinfo_harness as h  # noqa: E402
from benchmarks.opinfo import run_ops  # noqa: E402
from fuselens.events import CompiledGraph, ErrorEntry, GraphNode, Kernel  # noqa: E402

BACKEND = os.environ.get("FUSELENS_TEST_BACKEND", "fuselens")

# op -> variants. Pointwise unary/binary, reductions, normalisations, views,
# concatenation, indexing, library calls; inplace and out= where they matter.
SUBSET: dict[str, str] = {
    # pointwise unary
    "abs": "fn", "exp": "fn+inplace", "log": "fn", "rsqrt": "fn", "sigmoid": "fn+inplace",
    "tanh": "fn", "sin": "fn", "erf": "fn", "nn.functional.relu": "fn", "nn.functional.gelu": "fn",
    "nn.functional.silu": "fn", "clamp": "fn+inplace", "reciprocal": "fn",
    # pointwise binary / ternary, type promotion, comparisons
    "add": "fn+inplace+out", "mul": "fn+inplace", "div.no_rounding_mode": "fn", "pow": "fn",
    "maximum": "fn", "gt": "fn", "where": "fn", "lerp": "fn", "addcmul": "fn",
    # reductions and scans
    "sum": "fn+out", "mean": "fn", "amax": "fn", "argmax": "fn", "var": "fn", "prod": "fn",
    "logsumexp": "fn", "cumsum": "fn",
    # normalisations and losses
    "softmax": "fn", "log_softmax": "fn", "nn.functional.layer_norm": "fn",
    "nn.functional.batch_norm": "fn", "nn.functional.cross_entropy": "fn",
    # views and data movement
    "permute": "fn", "transpose": "fn", "expand": "fn", "squeeze": "fn", "__getitem__": "fn",
    "cat": "fn+out", "tril": "fn", "masked_fill": "fn+inplace", "gather": "fn",
    # library calls (extern)
    "matmul": "fn", "addmm": "fn", "nn.functional.linear": "fn",
}
SAMPLES_PER_OP = 2


@pytest.fixture(scope="module")
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """Run the selected ops' cases once in a worker; results by op."""
    selected = sorted(
        {item.callspec.params["op"] for item in request.session.items
         if item.module is request.module and hasattr(item, "callspec") and "op" in item.callspec.params}
    )
    tmp = tmp_path_factory.mktemp("opinfo")
    args = argparse.Namespace(
        backend=BACKEND, variants="fn", max_samples=SAMPLES_PER_OP, max_samples_mutating=1, case_timeout=120, threads=0,
        options="", dynamic=False,
    )
    records = run_ops([f"{op}:{SUBSET[op]}" for op in selected], args, tmp / "results.jsonl", tmp / "worker.log")
    by_op: dict[str, list[dict]] = collections.defaultdict(list)
    for rec in records:
        by_op[rec["op"]].append(rec)
    return by_op


@pytest.mark.parametrize("op", sorted(SUBSET))
def test_opinfo_op_compiled_matches_eager(op: str, results: dict[str, list[dict]]) -> None:
    records = results.get(op, [])
    assert records, f"no case ran for {op} (see the worker log)"
    failures = [r for r in records if r["status"] == "fail"]
    assert not failures, "\n".join(
        f"{r['variant']} sample {r['sample']} ({r['sample_desc']}): {r['category']}\n{r['detail']}" for r in failures
    )
    # The subset only holds ops Dynamo can hand to the backend: a case that
    # never reached the compiler tests nothing.
    assert any(r["status"] == "pass" for r in records), [(r["status"], r["category"]) for r in records]


# ---- harness self-tests: the comparison can fail -------------------------


def _op(name: str) -> Any:
    return next(op for op in h.float32_cpu_ops() if h.full_name(op) == name)


def _first_sample(op: Any) -> Any:
    return h.op_samples(op, 1)[0][1]


def _wrapping_backend(post: Callable[[Any, list], Any]) -> Callable:
    """A backend running the graph eagerly, then `post(outputs, inputs)`."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list, **_: Any) -> Callable:
        def run(*args: Any) -> Any:
            return post(gm(*args), list(args))

        return run

    return backend


def test_harness_reports_value_mismatch_of_a_backend_off_by_1e_3() -> None:
    def off(outs: Any, _: list) -> Any:
        return tuple(o + 1e-3 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs)

    op = _op("sin")
    res = h.run_case(op, 0, _first_sample(op), "fn", _wrapping_backend(off))
    assert (res.status, res.category) == ("fail", "value mismatch")


def test_harness_reports_stride_mismatch_of_a_transposed_result() -> None:
    def restride(outs: Any, _: list) -> Any:
        return tuple(o.t().contiguous().t() if isinstance(o, torch.Tensor) and o.dim() == 2 else o for o in outs)

    op = _op("add")
    sample = next(s for _, s in h.op_samples(op, None) if s.input.dim() == 2 and min(s.input.shape) > 1)
    res = h.run_case(op, 0, sample, "fn", _wrapping_backend(restride))
    assert (res.status, res.category) == ("fail", "stride mismatch")


def test_harness_reports_a_dropped_input_mutation() -> None:
    # An eager-interpreting backend that snapshots inputs and restores them
    # after the call: the mutation of add_ disappears, the output stays right.
    def backend(gm: torch.fx.GraphModule, example_inputs: list, **_: Any) -> Callable:
        def run(*args: Any) -> Any:
            saved = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            outs = gm(*args)
            outs = tuple(o.clone() if isinstance(o, torch.Tensor) else o for o in outs)
            for a, s in zip(args, saved):
                if isinstance(a, torch.Tensor):
                    a.copy_(s)
            return outs

        return run

    op = _op("add")
    sample = next(s for _, s in h.op_samples(op, None) if isinstance(s.args[0], torch.Tensor)
                  and not s.broadcasts_input)
    res = h.run_case(op, 0, sample, "inplace", backend)
    assert (res.status, res.category) == ("fail", "value mismatch")


def test_harness_skips_random_ops_and_flags_graphless_cases() -> None:
    op = _op("bernoulli")
    assert h.run_case(op, 0, _first_sample(op), "fn", "eager").status == "skip"
    op = _op("nonzero")  # data-dependent output shape: Dynamo graph-breaks, backend sees nothing
    assert h.run_case(op, 0, _first_sample(op), "fn", "eager").status == "not_compiled"


def test_node_accounting_splits_generated_extern_and_viewonly_nodes() -> None:
    nodes = [
        GraphNode("x", "placeholder", "x"),
        GraphNode("sin", "call_function", "aten.sin.default", kernel="cpp_fused_sin_0"),
        GraphNode("mm", "call_function", "aten.mm.default"),
        GraphNode("view", "call_function", "aten.view.default"),
        GraphNode("out", "output", "output"),
    ]
    events = [
        CompiledGraph("0/0", "f", None, "fuselens", stage="aot_inference", nodes=nodes, graph_id="0/0:aot_inference"),
        Kernel("cpp_fused_sin_0", "cpp", graph_id="0/0:aot_inference", nodes=["sin"]),
        Kernel("extern_mm_1", "extern", graph_id="0/0:aot_inference", nodes=["mm"], ops=["aten.mm.default"]),
    ]
    acc = h.account_nodes(events)
    assert (acc.lowered, acc.extern, acc.no_kernel) == (1, 1, 1)
    assert acc.extern_ops == ["aten.mm.default"]
    # A graph whose compile failed ran eagerly: all its nodes count as extern.
    acc = h.account_nodes(events + [ErrorEntry("compile", "g++ failed", compile_id="0/0")])
    assert (acc.lowered, acc.extern, acc.graph_fallbacks) == (0, 3, 1)


def test_bfloat16_subset_on_the_cpp_target_matches_eager(tmp_path: Path) -> None:
    # The same ops in bfloat16 (benchmarks/opinfo_bf16.py), in a subprocess so that a crash
    # in generated code fails this test instead of killing pytest.
    import json
    import subprocess

    out = tmp_path / "bf16.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.opinfo_bf16", "--json", str(out)],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-2000:]
    cases = json.loads(out.read_text())
    bad = [c for c in cases if not c["ok"] and not c.get("upstream")]
    assert len(cases) > 60 and not bad, bad[:3]
    assert sum(c.get("lowered", 0) for c in cases) > 200  # the bfloat16 ops ran in kernels, not ATen
