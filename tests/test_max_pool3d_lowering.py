"""max_pool3d_with_indices and its backward are lowered (compiler/lowering/max_pool.py):
values and indices as ATen computes them (the first maximum wins, a NaN wins, padding taps
never win), gradients gathered from the windows that chose each input, bit-equal to
ATen's, NCDHW and NDHWC (a dilated pool's backward stays ATen's). C++ in-process, Triton
in its CPU interpreter (subprocess)."""

from __future__ import annotations

from pathlib import Path

import torch
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)

# kernel, stride, padding, dilation, ceil_mode
CASES = [(2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 2, 1, 1, True), (3, 1, 1, 1, False),
         ((3, 2, 2), (2, 1, 2), (1, 0, 1), 1, True), (2, 1, 0, 2, False)]


def _mismatches(opts: dict) -> list[str]:
    from fuselens import sink
    from fuselens.events import ErrorEntry

    bad = []
    for k, s, p, d, ceil in CASES:
        for train in (False, True):
            for channels_last in (False, True):
                torch._dynamo.reset()
                torch.manual_seed(0)
                x = torch.randn(2, 3, 7, 9, 8)
                x[0, 0, 0, 0, 0] = float("nan")
                x[1, 1, :3, :3, :3] = float("-inf")  # a window with nothing above -inf: its index must be inside
                if channels_last:
                    x = x.to(memory_format=torch.channels_last_3d)
                x.requires_grad_(train)

                def f(x: torch.Tensor) -> tuple:
                    return torch.nn.functional.max_pool3d(x, k, s, p, d, ceil_mode=ceil, return_indices=True)

                ref, ref_idx = f(x)
                g = torch.randn_like(ref)
                with sink.collect() as events:
                    out, idx = torch.compile(f, backend="fuselens", options=opts)(x)
                    if train:
                        (mine,), (theirs,) = torch.autograd.grad(out, x, g), torch.autograd.grad(ref, x, g)
                same = (torch.equal(out.nan_to_num(), ref.nan_to_num()) and torch.equal(idx, ref_idx)
                        and out.stride() == ref.stride())
                if train:
                    same = same and torch.equal(mine.nan_to_num(), theirs.nan_to_num()) and mine.stride() == theirs.stride()
                ops = ["max_pool3d_with_indices.default"] + (["max_pool3d_with_indices_backward"] if d == 1 else [])
                fell_back = any(isinstance(e, ErrorEntry) and any(op in e.message for op in ops) for e in events)
                if not same or fell_back:
                    bad.append(f"k{k} s{s} p{p} d{d} ceil={ceil} train={train} cl={channels_last}"
                               + (" (ATen fallback)" if fell_back else ""))
    return bad


def test_max_pool3d_values_indices_and_gradients_are_atens_in_generated_cpp() -> None:
    assert _mismatches({"target": "cpp", "fallback_on_error": False}) == []


def test_a_training_forward_saves_the_indices_not_the_pool_input() -> None:
    torch._dynamo.reset()
    conv = torch.nn.Conv3d(3, 4, 3)
    x = torch.randn(2, 3, 8, 8, 8, requires_grad=True)

    def f(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool3d(conv(t), 2) * 2

    saved: list[tuple] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(t.shape), t.dtype))
        return t

    compiled = torch.compile(f, backend="fuselens", options={"target": "cpp", "fallback_on_error": False})
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = compiled(x)
    assert sorted(saved, key=str) == sorted([((2, 3, 8, 8, 8), torch.float32), ((4, 3, 3, 3, 3), torch.float32),
                                             ((2, 4, 3, 3, 3), torch.int64)], key=str), saved
    g = torch.randn_like(out)
    assert torch.equal(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(f(x), x, g)[0])


def test_max_pool3d_matches_eager_in_the_triton_interpreter(tmp_path: Path) -> None:
    records = interpreted_worker_records(__file__, tmp_path / "records.json", 900, "max-pool-3d worker")
    assert records == {"bad": []}


if __name__ == "__main__":  # pragma: no cover
    worker_main(lambda opts: {"bad": _mismatches(opts)}, "fl_pool3d_")
