"""Held-out architectures train one step like eager, with no op left to ATen
(benchmarks/architecture_sweep.py, which runs all 26): the ones this suite's fixes were
found on. RoBERTa's position ids are a cumsum, Bloom's ALiBi repeats a tensor, Falcon's
backward scatters with index_put, DenseNet's transitions and Inception's branches
average-pool, a UNet interpolates and pools both ways, a 1-d convolution stack pools over
a [N, C, 1, L] view and a 3-d one max-pools volumes."""

from __future__ import annotations

import pytest

from benchmarks.architecture_sweep import check


@pytest.mark.parametrize("name", ["roberta", "bloom", "falcon", "densenet", "inception", "unet", "swin", "conv1d_3d"])
def test_a_held_out_architecture_trains_one_step_like_eager_with_nothing_left_to_aten(name: str) -> None:
    r = check(name, "cpp")
    assert r["loss_err"] < 1e-4 and r["grad_err"] < 1e-4 and r["buffer_err"] < 1e-5, r
    assert r["left_to_aten"] == [], r["left_to_aten"]
