"""A pointwise C++ loop whose variable selects a cat's part or a pad's edge is split at
those points: each piece loads its part contiguously, the comparison and the index clamp
folded away (index_bounds.py; DenseNet's channels-last cats gathered every element).
C++ target, this CPU; the helpers' folding rules are checked on their own below."""

from __future__ import annotations

import re

import sympy
import torch
import torch.nn.functional as F

import fuselens.compiler  # noqa: F401
from fuselens import sink
from fuselens.compiler import index_bounds
from fuselens.events import Kernel

g, h = sympy.symbols("g h", integer=True, nonnegative=True)


def _kernels(fn, *args) -> tuple[list[Kernel], torch.Tensor]:
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(fn, backend="fuselens", options={"fallback_on_error": False})(*args)
    torch.testing.assert_close(out, fn(*args))
    return [k for k in events if isinstance(k, Kernel) and k.kind != "extern"], out


def test_a_cat_along_the_inner_dim_runs_one_loop_per_part_with_contiguous_unclamped_loads() -> None:
    a, b = torch.randn(2, 5, 6, 24), torch.randn(2, 5, 6, 8)

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.cat([a, b], 3) * 2)

    kernels, _ = _kernels(f, a, b)
    src = next(k.source for k in kernels if "cat" in k.name)
    assert len(re.findall(r"for \(int64_t g3 = (\d+); g3 < (\d+);", src)) == 2, src
    assert "for (int64_t g3 = 24; g3 < 32;" in src, src
    assert "fl_imin" not in src and " ? " not in src, src


def test_a_pad_of_the_inner_dim_writes_its_edges_without_loading_and_matches_eager() -> None:
    x = torch.randn(3, 7, 10)

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x * 3, (2, 3), value=0.5) + 1

    kernels, out = _kernels(f, x)
    assert len(kernels) == 1
    src = kernels[0].source
    loops = re.findall(r"for \(int64_t g2 = (\d+); g2 < (\d+);", src)
    assert loops == [("0", "2"), ("2", "12"), ("12", "15")], src
    assert "fl_imin" not in src and "fl_imax" not in src, src
    assert out.shape == (3, 7, 15)


def test_a_loop_without_such_a_comparison_is_not_split() -> None:
    kernels, _ = _kernels(lambda x: (x * 2).relu(), torch.randn(4, 33))
    assert all(len(re.findall(r"#pragma omp simd", k.source)) <= 1 for k in kernels)


def test_clamps_fold_where_the_ranges_decide_them_and_stay_where_they_do_not() -> None:
    inside = {g: (0, 191)}
    assert index_bounds.fold_clamps(sympy.Min(191, g), inside) == g
    tail = {g: (192, 223)}
    assert index_bounds.fold_clamps(sympy.Min(31, sympy.Max(0, g - 192)), tail) == g - 192
    assert index_bounds.fold_clamps(sympy.Min(191, g), {g: (0, 223)}) == sympy.Min(191, g)
    assert index_bounds.fold_clamps(sympy.Min(h, g), inside) == sympy.Min(h, g)  # h: no range known


def test_comparisons_are_decided_only_where_the_whole_range_answers_alike() -> None:
    assert index_bounds.decide("lt", g, sympy.Integer(192), {g: (0, 191)}) is True
    assert index_bounds.decide("lt", g, sympy.Integer(192), {g: (192, 223)}) is False
    assert index_bounds.decide("lt", g, sympy.Integer(192), {g: (0, 223)}) is None
    assert index_bounds.decide("ge", g - 2, sympy.Integer(0), {g: (2, 11)}) is True


def test_a_comparison_of_the_loop_variable_with_a_constant_changes_answer_at_its_flip_point() -> None:
    assert index_bounds.flip_point("lt", g, sympy.Integer(192), g) == 192
    assert index_bounds.flip_point("ge", g - 2, sympy.Integer(0), g) == 2
    assert index_bounds.flip_point("le", g, sympy.Integer(5), g) == 6
    assert index_bounds.flip_point("gt", -g + 9, sympy.Integer(0), g) == 9
    assert index_bounds.flip_point("lt", 2 * g, sympy.Integer(7), g) is None  # not a unit step
