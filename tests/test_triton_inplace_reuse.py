"""The Triton target writes a 1-D pointwise kernel's output over an input that dies
at that kernel (codegen/triton.py `_inplace_candidates`, plan.py
`_reuse_dying_inputs`): a residual add+ReLU after a library call takes the call's
memory instead of a fresh buffer (ResNet-50 inference held a third 49 MB activation
at its peak). An input read at other elements than the stored one (a flip) is no
candidate. Triton in its CPU interpreter (subprocess): the generated wrapper is
read back from linecache, where fuselens registers it for tracebacks."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import torch
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


def _residual(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w * 2 + z)


def _flipped(x: torch.Tensor, w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    a = x @ w
    return a * 2 + a.flip(0) + z


def _records(opts: dict) -> dict:
    out = {}
    for name, f in (("residual", _residual), ("flipped", _flipped)):
        torch._dynamo.reset()
        torch.manual_seed(0)
        x, w, z = torch.randn(16, 8), torch.randn(8, 32), torch.randn(16, 32)
        before = {k for k in linecache.cache if k.startswith("<fuselens-wrapper")}
        got = torch.compile(f, backend="fuselens", options=opts)(x, w, z)
        (wrapper,) = [k for k in linecache.cache if k.startswith("<fuselens-wrapper") and k not in before]
        src = "".join(linecache.cache[wrapper][2])
        out[name] = {"equal": torch.allclose(got, f(x, w, z), atol=1e-5, rtol=1e-5),
                     "in_place": bool(re.search(r"^\s*b_\w+ = b_mm\s*$", src, re.M)), "wrapper": src}
    return out


def test_a_pointwise_kernel_writes_over_a_dying_input_it_reads_only_at_the_stored_element(tmp_path: Path) -> None:
    r = interpreted_worker_records(__file__, tmp_path / "records.json", 600, "in-place worker")
    assert r["residual"]["equal"] and r["residual"]["in_place"], r["residual"]["wrapper"]
    assert r["flipped"]["equal"] and not r["flipped"]["in_place"], r["flipped"]["wrapper"]


if __name__ == "__main__":  # pragma: no cover
    worker_main(_records, "fl_inplace_")
