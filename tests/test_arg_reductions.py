"""argmax, argmin, and max/min over a dim with their indices are generated code
(reductions.py `_arg_reduce`): ATen ran each as a kernel of its own (a training loop's
accuracy, greedy decoding, a top-1 router). Exactly eager's indices: the first extreme
wins ties, a NaN counts as the extreme (the first NaN), a flat row-major index without a
dim, a bool's largest is its first True; values and gradients too. C++ in-process, Triton in its CPU interpreter."""

from __future__ import annotations

from pathlib import Path

import torch
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 7, generator=g)
    ties = torch.randint(0, 3, (6, 9), generator=g).float()  # many equal extremes per row
    nans = torch.randn(4, 8, generator=g)
    nans[0, 3] = nans[0, 6] = float("nan")
    nans[2, 0] = float("nan")
    nans[3] = float("-inf")
    return {"x": x, "ties": ties, "nans": nans, "ints": torch.randint(-5, 5, (5, 8), generator=g),
            "bf16": torch.randn(8, 33, generator=g).to(torch.bfloat16),
            "mask": torch.randint(0, 4, (6, 9), generator=g) == 0}  # rows with no True too


CASES = {
    "argmax_last": ("x", lambda t: t.argmax(-1)),
    "argmax_dim0_keepdim": ("x", lambda t: t.argmax(0, keepdim=True)),
    "argmin_middle": ("x", lambda t: (t * 2).argmin(1)),
    "argmax_flat": ("x", lambda t: t.argmax()),
    "argmin_flat_keepdim": ("x", lambda t: t.argmin(None, keepdim=True)),
    "argmax_ties": ("ties", lambda t: t.argmax(-1)),
    "argmin_ties": ("ties", lambda t: t.argmin(0)),
    "argmax_nans": ("nans", lambda t: t.argmax(-1)),
    "argmin_nans": ("nans", lambda t: t.argmin(-1)),
    "argmax_ints": ("ints", lambda t: t.argmax(1)),
    "argmax_bf16": ("bf16", lambda t: t.argmax(-1)),
    "max_dim": ("x", lambda t: t.max(-1)),
    "min_dim_keepdim": ("ties", lambda t: t.min(1, keepdim=True)),
    "max_dim_nans": ("nans", lambda t: t.max(-1)),
    "accuracy": ("x", lambda t: (t.sum(1).argmax(-1) == 3).float().mean()),
    "first_true": ("mask", lambda t: t.max(-1)),  # cumprod's backward: a row's first zero
    "min_dim_bool": ("mask", lambda t: t.min(0)),
}


def _run(opts: dict) -> dict:
    """Per case: equal to eager (values, indices and dtypes), and whether an op fell back."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    inputs = _inputs()
    out = {}
    for name, (which, fn) in CASES.items():
        torch._dynamo.reset()
        with sink.collect() as events:
            got = torch.compile(fn, backend="fuselens", options=opts)(inputs[which])
        ref = fn(inputs[which])
        got, ref = (tuple(got), tuple(ref)) if isinstance(ref, tuple) else ((got,), (ref,))
        same = all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) if not a.is_floating_point()
                   else torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(got, ref))
        fell_back = [e.message.split(" runs in")[0] for e in events if isinstance(e, ErrorEntry)]
        out[name] = [bool(same), fell_back]
    torch._dynamo.reset()
    x = _inputs()["x"].requires_grad_()

    def top1(t: torch.Tensor) -> torch.Tensor:  # a top-1 router's weight: the max's gradient
        return t.softmax(-1).max(-1).values.square().sum()

    with sink.collect() as events:
        (mine,) = torch.autograd.grad(torch.compile(top1, backend="fuselens", options=opts)(x), x)
    (theirs,) = torch.autograd.grad(top1(x), x)
    out["max_dim_grad"] = [bool(torch.allclose(mine, theirs, atol=1e-7)),
                           [e.message.split(" runs in")[0] for e in events if isinstance(e, ErrorEntry)]]
    return out


EXPECTED = {name: [True, []] for name in [*CASES, "max_dim_grad"]}


def test_arg_reductions_are_generated_and_give_eagers_indices_in_cpp() -> None:
    assert _run({"target": "cpp", "fallback_on_error": False}) == EXPECTED


def test_arg_reductions_in_the_triton_interpreter(tmp_path: Path) -> None:
    assert interpreted_worker_records(__file__, tmp_path / "r.json", 900, "arg-reduction worker") == EXPECTED


if __name__ == "__main__":  # pragma: no cover
    worker_main(_run, "fl_argreduce_")
