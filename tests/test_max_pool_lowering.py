"""max_pool2d_with_indices and its backward are lowered (a ResNet stem's pooling was
an ATen kernel between two generated ones, forward and backward): values and indices
as ATen computes them (first maximum wins, NaN wins, padding taps never win), and
gradients gathered from the windows that chose each input, bit-equal to ATen's
(dilated pools' backward stays ATen's). C++ in-process, Triton in its CPU
interpreter (subprocess)."""

from __future__ import annotations

from pathlib import Path

import torch
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)

CASES = [(3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 1, 1, 2, False), (3, 2, 0, 1, True), (3, 2, 1, 1, True)]


def _mismatches(opts: dict) -> list[str]:
    """Each pooling case, inference and training, NCHW and channels-last, against eager."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    bad = []
    for k, s, p, d, ceil in CASES:
        for train in (False, True):
            for channels_last in (False, True):
                torch._dynamo.reset()
                torch.manual_seed(0)
                x = torch.randn(2, 3, 11, 10)
                x[0, 0, 0, 0] = float("nan")
                x[1, 1, :3, :3] = float("-inf")  # a window with nothing above -inf: its index must be inside
                if channels_last:
                    x = x.to(memory_format=torch.channels_last)
                x.requires_grad_(train)

                def f(x: torch.Tensor) -> torch.Tensor:
                    return torch.nn.functional.max_pool2d(x, k, s, p, d, ceil_mode=ceil) * 2

                ref = f(x)
                g = torch.randn_like(ref)
                with sink.collect() as events:
                    out = torch.compile(f, backend="fuselens", options=opts)(x)
                    if train:  # the backward compiles at its first call
                        (mine,), (theirs,) = torch.autograd.grad(out, x, g), torch.autograd.grad(ref, x, g)
                same = torch.equal(out.nan_to_num(), ref.nan_to_num())
                if train:  # sums of at most four gradients, in ATen's order: bit-equal
                    same = same and torch.equal(mine.nan_to_num(), theirs.nan_to_num())
                ops = ["max_pool2d_with_indices.default"] + (["max_pool2d_with_indices_backward"] if d == 1 else [])
                fell_back = any(isinstance(e, ErrorEntry) and any(op in e.message for op in ops) for e in events)
                if not same or fell_back:
                    bad.append(f"k{k} s{s} p{p} d{d} ceil={ceil} train={train} cl={channels_last}"
                               + (" (ATen fallback)" if fell_back else ""))
    return bad


def test_max_pool2d_values_indices_and_gradients_match_eager_in_generated_cpp() -> None:
    assert _mismatches({"target": "cpp", "fallback_on_error": False}) == []


def test_a_training_forward_saves_int8_window_places_and_returns_eager_indices() -> None:
    """The backward recomputes the int64 indices from places saved as int8 (ResNet-50's
    stem: 6 MB saved, not 49) and scatters the gradient there: it needs not the pool's
    input, which is not saved (51 MB more); indices the program itself asks for are eager's."""
    opts = {"target": "cpp", "fallback_on_error": False}

    def pool(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.max_pool2d(x, 3, 2, 1) * 2

    def with_indices(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True)

    torch._dynamo.reset()
    x = torch.randn(2, 3, 12, 10, requires_grad=True)
    saved: list[torch.dtype] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.dtype)
        return t

    compiled = torch.compile(pool, backend="fuselens", options=opts)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        v = compiled(x)
    assert saved == [torch.int8], saved  # the places alone
    assert torch.equal(torch.autograd.grad(v.sum(), x)[0], torch.autograd.grad(pool(x).sum(), x)[0])
    (v, i), (rv, ri) = torch.compile(with_indices, backend="fuselens", options=opts)(x), with_indices(x)
    assert torch.equal(i, ri) and torch.equal(v, rv)


def test_max_pool1d_and_pools_over_a_dim_of_one_train_without_saving_the_pool_input() -> None:
    """max_pool1d pools a [N, C, 1, L] view, as does a 2-d pool over one row: its backward's
    stand-in for the pool's input (shape only) has a dim of one, whose stride tracing may set
    to anything (it recursed into itself until Python's limit: a Conv1d + MaxPool1d model did
    not compile). Gradients are eager's; what is saved is Inductor's: the window places and
    the ReLU's mask, not the pool's input."""
    opts = {"target": "cpp", "fallback_on_error": False}
    for pool, x in ((lambda t: torch.nn.functional.max_pool1d(t, 2) * 2, torch.randn(2, 3, 9)),
                    (lambda t: torch.nn.functional.max_pool2d(t, (1, 3), 2) * 2, torch.randn(2, 3, 1, 11))):
        torch._dynamo.reset()
        relu_then_pool = lambda t, pool=pool: pool(torch.relu(t))  # noqa: E731 - the input a ReLU's output
        x.requires_grad_(True)
        saved: list[tuple] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved.append((tuple(t.shape), t.dtype))
            return t

        compiled = torch.compile(relu_then_pool, backend="fuselens", options=opts)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            v = compiled(x)
        assert sorted(str(dtype) for _, dtype in saved) == ["torch.bool", "torch.int8"], saved  # ReLU's mask, places
        g = torch.randn_like(v)
        assert torch.equal(torch.autograd.grad(v, x, g)[0], torch.autograd.grad(relu_then_pool(x), x, g)[0])


def test_max_pool2d_matches_eager_in_the_triton_interpreter(tmp_path: Path) -> None:
    records = interpreted_worker_records(__file__, tmp_path / "records.json", 900, "max-pool worker")
    assert records == {"bad": []}


if __name__ == "__main__":  # pragma: no cover
    worker_main(lambda opts: {"bad": _mismatches(opts)}, "fl_pool_")
