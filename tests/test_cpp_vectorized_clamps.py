"""Index clamps (a pooling window's padding, a gather's bounds) inside a C++ kernel's
`omp simd` loop leave the loop vectorizable. std::min and std::max take references, and
g++ kept each argument in a per-lane array (its report: "no vectype for stmt: D.123[_4]
= ..."), which it cannot vectorize: ResNet-50's 3x3 max-pool ran scalar, 1.5 ms where
the vectorized loop takes 0.5. C++ target, this CPU's g++, asked what it did not
vectorize."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F

import fuselens.compiler  # noqa: F401
from fuselens import sink
from fuselens.compiler.codegen.cpp_prelude import PRELUDE
from fuselens.events import Kernel


def _per_lane_arrays(source: str, tmp_path: Path) -> list[str]:
    """g++'s reports of per-lane temporaries in `source`'s loops that kept them scalar."""
    path = tmp_path / "kernel.cpp"
    path.write_text(PRELUDE + source)
    done = subprocess.run(["g++", "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-c",
                           "-o", str(tmp_path / "kernel.o"), "-fopt-info-vec-missed", str(path)],
                          capture_output=True, text=True, check=True)
    return re.findall(r"no vectype for stmt: D\.\d+\[.*", done.stderr)


def test_a_padded_max_pool_over_channels_last_input_keeps_its_simd_loop_free_of_per_lane_index_arrays(
        tmp_path: Path) -> None:
    x = torch.randn(2, 64, 20, 20).to(memory_format=torch.channels_last)

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(x), 3, 2, 1)

    torch._dynamo.reset()
    with sink.collect() as events, torch.no_grad():
        out = torch.compile(f, backend="fuselens", options={"fallback_on_error": False})(x)
    torch.testing.assert_close(out, f(x))
    (pool,) = [k for k in events if isinstance(k, Kernel) and k.kind != "extern" and "max_pool" in k.name]
    assert "pragma omp simd" in pool.source
    assert not _per_lane_arrays(pool.source, tmp_path), pool.source
