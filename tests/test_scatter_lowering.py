"""`scatter` and `scatter_add` with a few indices per line along their dim (up to
SCATTER_MAX_PER_LINE) are lowered as comparisons in the output's space (cross-entropy's
backward: no ATen copy of a zeros tensor the size of the logits; top-k's backward in a
mixture-of-experts router; a `gather`'s backward, DeepSeek-V3's router); scatters with more
stay ATen's. Where a line names an element twice, the last index wins (`scatter`) or both
are added in index order (`scatter_add`), as in ATen's CPU kernel. C++ in-process, Triton
in its interpreter."""

from __future__ import annotations

from pathlib import Path

import torch
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


def _cases() -> dict:
    g = torch.Generator().manual_seed(0)
    x, src = torch.randn(6, 9, generator=g), torch.randn(6, 1, generator=g)
    rows, cols = torch.randint(0, 9, (6, 1), generator=g), torch.randint(0, 6, (1, 9), generator=g)
    three = torch.randint(0, 9, (6, 3), generator=g)
    three[0] = torch.tensor([4, 1, 4])  # element 4 named twice: the later src wins
    src3 = torch.randn(6, 3, generator=g)
    wide = torch.randint(0, 9, (6, 12), generator=g)  # more indices per line than compared: ATen's scatter
    return {
        "src_dim1": (lambda x, i, s: x.scatter(1, i, s) * 2, (x, rows, src)),
        "value_dim0": (lambda x, i: x.scatter(0, i, 2.5) + 1, (x, cols)),
        "value_last_dim": (lambda x, i: x.scatter(-1, i, -1.0).exp(), (x, rows)),
        "three_per_line": (lambda x, i, s: x.scatter(1, i, s) + 1, (x, three, src3)),
        "three_per_line_value": (lambda x, i: x.scatter(1, i, 0.0) + 1, (x, three)),
        "many_per_line": (lambda x, i: x.scatter(1, i, 0.0) + 1, (x, wide)),
        "add_three_per_line": (lambda x, i, s: x.scatter_add(1, i, s) * 2, (x, three, src3)),
        "add_many_per_line": (lambda x, i, s: x.scatter_add(1, i, s) + 1, (x, wide, torch.randn(6, 12, generator=g))),
    }


def _run(opts: dict) -> dict:
    """Per case: matches eager, and whether the scatter ran in ATen."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    out = {}
    for name, (fn, args) in _cases().items():
        torch._dynamo.reset()
        with sink.collect() as events:
            got = torch.compile(fn, backend="fuselens", options=opts)(*args)
        aten = any(isinstance(e, ErrorEntry) and "aten.scatter" in e.message for e in events)
        out[name] = [bool(torch.allclose(got, fn(*args))), aten]
    torch._dynamo.reset()
    logits = torch.randn(64, 37, requires_grad=True)
    target = torch.randint(0, 37, (64,))
    target[3] = -100

    def loss(z: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(z, target)

    with sink.collect() as events:
        (mine,) = torch.autograd.grad(torch.compile(loss, backend="fuselens", options=opts)(logits), logits)
    (theirs,) = torch.autograd.grad(loss(logits), logits)
    aten = any(isinstance(e, ErrorEntry) and "aten.scatter" in e.message for e in events)
    out["cross_entropy_grad"] = [bool(torch.allclose(mine, theirs, atol=1e-7)), aten]
    torch._dynamo.reset()
    router = torch.randn(32, 8, requires_grad=True)

    def top2(z: torch.Tensor) -> torch.Tensor:  # a mixture-of-experts router's weights
        w, _ = torch.topk(z.softmax(-1), 2, dim=-1)
        return (w / w.sum(-1, keepdim=True)).square().sum()

    with sink.collect() as events:
        (mine,) = torch.autograd.grad(torch.compile(top2, backend="fuselens", options=opts)(router), router)
    (theirs,) = torch.autograd.grad(top2(router), router)
    aten = any(isinstance(e, ErrorEntry) and "aten.scatter" in e.message for e in events)
    out["top2_router_grad"] = [bool(torch.allclose(mine, theirs, atol=1e-7)), aten]
    torch._dynamo.reset()
    scores = torch.randn(32, 8, requires_grad=True)
    picked = torch.topk(scores.detach(), 2, dim=-1).indices

    def gathered(z: torch.Tensor) -> torch.Tensor:  # each token's top-2 expert scores, gathered
        return z.sigmoid().gather(1, picked).square().sum()

    with sink.collect() as events:
        (mine,) = torch.autograd.grad(torch.compile(gathered, backend="fuselens", options=opts)(scores), scores)
    (theirs,) = torch.autograd.grad(gathered(scores), scores)
    aten = any(isinstance(e, ErrorEntry) and "aten.scatter" in e.message for e in events)
    out["gather_grad"] = [bool(torch.allclose(mine, theirs, atol=1e-7)), aten]
    return out


EXPECTED = {"src_dim1": [True, False], "value_dim0": [True, False], "value_last_dim": [True, False],
            "three_per_line": [True, False], "three_per_line_value": [True, False], "many_per_line": [True, True],
            "add_three_per_line": [True, False], "add_many_per_line": [True, True],
            "cross_entropy_grad": [True, False], "top2_router_grad": [True, False], "gather_grad": [True, False]}


def test_scatter_with_few_indices_per_line_is_generated_code_and_others_stay_aten() -> None:
    assert _run({"target": "cpp", "fallback_on_error": False}) == EXPECTED


def test_scatter_lowering_in_the_triton_interpreter(tmp_path: Path) -> None:
    assert interpreted_worker_records(__file__, tmp_path / "r.json", 600, "scatter worker") == EXPECTED


if __name__ == "__main__":  # pragma: no cover
    worker_main(_run, "fl_scatter_")
