"""cumsum and cumprod are lowered as masked reductions (compiler/lowering/reductions.py) while its work
is small: RoBERTa's and OPT's position ids, a cumsum of the padding mask over the sequence,
fuse with the mask and the offset instead of an ATen kernel between them. Integers exact,
floats within rounding (summed in double in C++, as ATen's CPU scan does), gradients
eager's; a large one stays ATen's scan. C++ in-process, Triton in its CPU interpreter."""

from __future__ import annotations

from pathlib import Path

import torch
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


def _position_ids(ids: torch.Tensor) -> torch.Tensor:  # RoBERTa's create_position_ids_from_input_ids
    mask = ids.ne(1).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1


CASES = {
    "position ids": (_position_ids, lambda: (torch.randint(0, 5, (3, 37)),)),
    "bool over dim 0": (lambda m: torch.cumsum(m, 0), lambda: (torch.rand(9, 4) > 0.5,)),
    "int32 transposed": (lambda t: torch.cumsum(t.t(), 1), lambda: (torch.randint(-5, 5, (6, 4), dtype=torch.int32),)),
    "float": (lambda t: torch.cumsum(t * 2, 1), lambda: (torch.randn(3, 50, 4),)),
    "cumprod float": (lambda t: torch.cumprod(t * 0.5 + 1, 1), lambda: (torch.rand(3, 30, 4),)),
    "cumprod int64 with zeros": (lambda t: torch.cumprod(t, -1), lambda: (torch.randint(0, 3, (5, 9)),)),
}


def _mismatches(opts: dict) -> list[str]:
    from fuselens import sink
    from fuselens.events import ErrorEntry

    bad = []
    for name, (f, make) in CASES.items():
        torch._dynamo.reset()
        torch.manual_seed(0)
        args = make()
        with sink.collect() as events:
            out = torch.compile(f, backend="fuselens", options=opts)(*args)
        ref = f(*args)
        same = out.dtype == ref.dtype and out.stride() == ref.stride() and (
            torch.equal(out, ref) if not ref.is_floating_point() else torch.allclose(out, ref, rtol=1e-5, atol=1e-5))
        if not same or any(isinstance(e, ErrorEntry) for e in events):
            bad.append(name)
    torch._dynamo.reset()
    x = torch.randn(3, 20, requires_grad=True)

    def g(t: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(t.sin(), 1).square().sum()

    def p(t: torch.Tensor) -> torch.Tensor:  # cumprod's backward divides by the input where it is not 0
        return (torch.cumprod(t, 1) * torch.arange(20.0)).sum()

    for name, fn in (("gradient", g), ("cumprod gradient", p)):
        torch._dynamo.reset()
        with sink.collect() as events:
            (mine,) = torch.autograd.grad(torch.compile(fn, backend="fuselens", options=opts)(x), x)
        if not torch.allclose(mine, torch.autograd.grad(fn(x), x)[0], rtol=1e-5, atol=1e-5) or any(
                isinstance(e, ErrorEntry) for e in events):
            bad.append(name)
    return bad


def test_cumsum_values_and_gradients_are_eagers_in_generated_cpp() -> None:
    assert _mismatches({"target": "cpp", "fallback_on_error": False}) == []


def test_a_cumsum_of_too_many_adds_stays_atens_scan_and_says_so() -> None:
    from fuselens import sink
    from fuselens.events import ErrorEntry

    torch._dynamo.reset()
    x = torch.randn(64, 4096)
    with sink.collect() as events:
        out = torch.compile(lambda t: t.cumsum(1), backend="fuselens", options={"target": "cpp"})(x)
    torch.testing.assert_close(out, x.cumsum(1))
    assert [e for e in events if isinstance(e, ErrorEntry) and "ATen's scan" in e.message]


def test_cumsum_matches_eager_in_the_triton_interpreter(tmp_path: Path) -> None:
    records = interpreted_worker_records(__file__, tmp_path / "records.json", 900, "cumsum worker")
    assert records == {"bad": []}


if __name__ == "__main__":  # pragma: no cover
    worker_main(lambda opts: {"bad": _mismatches(opts)}, "fl_cumsum_")
