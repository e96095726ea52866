"""The Triton target writes a 1-D pointwise kernel's output over an input that dies
at that kernel (codegen/triton_inplace.py, plan.py
`_reuse_dying_inputs`): a residual add+ReLU after a library call takes the call's
memory instead of a fresh buffer (ResNet-50 inference held a third 49 MB activation
at its peak); so does a reduction kernel's stored value when one pass reads and stores it. An input read at other elements than the stored one (a flip) is no
candidate. A library call that copies a dying buffer of ours before updating it
(index_add over an embedding gradient's zero table) updates it in place instead
(plan.py `_externs_in_place`). Triton in its CPU interpreter (subprocess): the
generated wrapper is read back from linecache, where fuselens registers it for
tracebacks."""

from __future__ import annotations

import linecache
import re

import pytest
import torch
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


def _residual(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w * 2 + z)


def _flipped(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    a = x @ w
    return a * 2 + a.flip(0) + z


def _mlp_gelu(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    # ConvNeXt's MLP: the Linear computes over [N, C] rows, the GELU reads them as [B, H, W, C]
    h = torch.nn.functional.linear(x.view(-1, 8), w.t()).view(2, 2, 4, 32)
    return torch.nn.functional.gelu(h) + z.view(2, 2, 4, 32)


def _with_column_sums(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> tuple:
    # a GELU backward's gradient and its bias gradient: one pass over the rows stores the
    # values and sums them
    y = x @ w * torch.sigmoid(z)
    return y, y.sum(0)


def _columns_centered(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    # the stored value needs the column means first: a second pass reads the input again
    a = x @ w
    return a - a.mean(0) + z


def _several_outputs(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> tuple:
    # DenseNet's backward: each earlier layer's running gradient plus its slice of the new one
    a, b, c = x @ w, x @ w.flip(1), x @ (w * 2)
    return a + z, b + z * 2 + a, c * z - b


def _read_for_another_output(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> tuple:
    # the product is read at every element the first output stores, but only for the second
    return z * 2, x @ w + z


def _records(opts: dict) -> dict:
    out = {}
    for name, f in (("residual", _residual), ("flipped", _flipped), ("viewed", _mlp_gelu),
                    ("column_sums", _with_column_sums), ("centered", _columns_centered),
                    ("several", _several_outputs), ("another", _read_for_another_output)):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x, w, z = torch.randn(16, 8), torch.randn(8, 32), torch.randn(16, 32)
        before = {k for k in linecache.cache if k.startswith("<fuselens-wrapper")}
        got = torch.compile(f, backend="fuselens", options=opts)(x, w, z)
        (wrapper,) = [k for k in linecache.cache if k.startswith("<fuselens-wrapper") and k not in before]
        src = "".join(linecache.cache[wrapper][2])
        want = f(x, w, z)
        pairs = zip(got, want) if isinstance(want, tuple) else [(got, want)]
        out[name] = {"equal": all(torch.allclose(g, e, atol=1e-5, rtol=1e-5) for g, e in pairs),
                     "in_place": bool(re.search(r"^\s*b_\w+ = b_mm\s*$", src, re.M)),
                     "restrided": bool(re.search(r"^\s*b_\w+ = b_mm\.as_strided\(", src, re.M)), "wrapper": src}
    return out


def _embedding_gradient(opts: dict) -> dict:
    """An embedding's backward with the index_add rewrite the Triton target applies on
    CUDA (graph_passes.index_put_accumulate_as_index_add), forced here on the CPU."""
    from fuselens.compiler import graph_passes
    from fuselens.compiler.runtime import plan
    from fuselens.compiler.targets.triton import TritonTarget

    taken: list[set] = []
    planner_run = plan.Planner._externs_in_place

    def record(self: plan.Planner) -> set:
        taken.append(planner_run(self))
        return taken[-1]

    TritonTarget.graph_rewrites = lambda self, gm, ex, stage: graph_passes.index_put_accumulate_as_index_add(
        gm, require_cuda=False)
    plan.Planner._externs_in_place = record
    torch._dynamo.reset()
    emb = torch.nn.Embedding(11, 4)
    ids = torch.tensor([[1, 2, 2, 10], [0, 2, 5, 1]])
    (torch.compile(emb, backend="fuselens", options=opts)(ids) * 3).sum().backward()
    mine = emb.weight.grad.clone()
    emb.weight.grad = None
    (emb(ids) * 3).sum().backward()
    return {"equal": torch.equal(mine, emb.weight.grad), "taken": [sorted(t) for t in taken]}


def _inverse_permutation(opts: dict) -> dict:
    """A mixture-of-experts layer's inverse routing permutation: index_put of more
    positions than the generated code compares (an ATen call) into an uninitialised
    buffer, which ATen's out-of-place form would copy first."""
    from fuselens.compiler.runtime import plan

    def invert(scores: torch.Tensor) -> torch.Tensor:
        perm = torch.argsort(scores)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        return inv * 3

    calls: list[str] = []
    planner_run = plan.Planner._externs_in_place

    def record(self: plan.Planner) -> set:
        taken = planner_run(self)
        calls.extend(str(st.target) for st in self.plan if isinstance(st, plan.ExternCall))
        return taken

    plan.Planner._externs_in_place = record
    try:
        torch._dynamo.reset()
        scores = torch.randn(64)
        got = torch.compile(invert, backend="fuselens", options=opts)(scores)
    finally:
        plan.Planner._externs_in_place = planner_run
    return {"equal": torch.equal(got, invert(scores)), "calls": calls}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return interpreted_worker_records(__file__, tmp_path_factory.mktemp("inplace") / "records.json", 600,
                                      "in-place worker")


def test_an_embedding_gradient_accumulates_into_its_zero_table_in_place(records: dict) -> None:
    r = records["embedding"]
    assert r["equal"] and any(len(t) == 2 for t in r["taken"]), r  # the table and index_add's result


def test_an_inverse_permutation_is_written_into_its_uninitialised_buffer_in_place(records: dict) -> None:
    r = records["inverse_permutation"]
    assert r["equal"] and "aten.index_put_.default" in r["calls"], r


def test_a_pointwise_kernel_writes_over_a_dying_input_viewed_with_other_sizes(records: dict) -> None:
    # the GELU after a Linear whose output it reads as 4-D takes the Linear's memory
    r = records["viewed"]
    assert r["equal"] and r["restrided"], r["wrapper"]


def test_a_pointwise_kernel_writes_over_a_dying_input_it_reads_only_at_the_stored_element(records: dict) -> None:
    r = records
    assert r["residual"]["equal"] and r["residual"]["in_place"], r["residual"]["wrapper"]
    assert r["flipped"]["equal"] and not r["flipped"]["in_place"], r["flipped"]["wrapper"]


def test_each_output_of_a_pointwise_kernel_writes_over_a_dying_input_that_feeds_it(records: dict) -> None:
    """Several outputs, several dying inputs: each output takes one whose every load feeds
    its own value (then the element is read before the program overwrites it, however
    the compiler orders the other outputs' work); an input read only for another output
    is no candidate for this one."""
    several = records["several"]
    taken = re.findall(r"^\s*(b_\w+) = (b_mm\w*)\s*$", several["wrapper"], re.M)
    assert several["equal"] and len(taken) == 3 and len({b for _, b in taken}) == 3, several["wrapper"]
    another = records["another"]
    assert another["equal"] and re.findall(r"^\s*(b_\w+) = b_mm\s*$", another["wrapper"], re.M) == ["b_add"], \
        another["wrapper"]


def test_a_one_pass_reduction_kernel_writes_its_values_over_a_dying_input(records: dict) -> None:
    """ViT-B/16's GELU backward stores its gradient and sums it for the bias in one pass:
    the gradient takes the dying input's memory (36.9 MB less at the backward's peak). A
    kernel that reads the input again after a first pass (the column means) does not."""
    assert records["column_sums"]["equal"] and records["column_sums"]["in_place"], records["column_sums"]["wrapper"]
    assert records["centered"]["equal"] and not records["centered"]["in_place"], records["centered"]["wrapper"]


if __name__ == "__main__":  # pragma: no cover
    worker_main(lambda opts: {**_records(opts), "inverse_permutation": _inverse_permutation(opts),
                                      "embedding": _embedding_gradient(opts)}, "fl_inplace_")
