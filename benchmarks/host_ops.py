"""The host cost of what a generated wrapper does per call, in microseconds (GPU only).

    python -m benchmarks.host_ops

A host-bound training step (DenseNet-121's) is mostly these: fresh tensors from the
caching allocator, views re-created by `_reinterpret_tensor`, `data_ptr` reads for
launches. What a wrapper change saves is the count it removes times these costs.
"""

from __future__ import annotations

import json
import time
from typing import Callable

import torch


def per_call_us(f: Callable[[], object], n: int = 20000) -> float:
    for _ in range(1000):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return round((time.perf_counter() - t) / n * 1e6, 3)


def main() -> int:
    from torch._C._dynamo.guards import _empty_strided_cuda, _reinterpret_tensor

    base = torch.empty(1 << 22, device="cuda")
    r = {"fresh tensor, 64 floats": per_call_us(lambda: _empty_strided_cuda((64,), (1,), torch.float32)),
         "fresh tensor, 12 MB channels-last": per_call_us(
             lambda: _empty_strided_cuda((32, 64, 56, 56), (200704, 1, 3584, 64), torch.bfloat16))}
    keep = [torch.empty(1000 + i, device="cuda") for i in range(2000)]  # a pool with many live blocks
    r["fresh tensor, 64 floats, 2000 blocks live"] = per_call_us(
        lambda: _empty_strided_cuda((64,), (1,), torch.float32))
    del keep
    r["torch.empty_strided, 64 floats"] = per_call_us(
        lambda: torch.empty_strided((64,), (1,), dtype=torch.float32, device="cuda"))
    r["reinterpret 1-d"] = per_call_us(lambda: _reinterpret_tensor(base, (64,), (1,), 128))
    r["reinterpret 4-d"] = per_call_us(lambda: _reinterpret_tensor(base, (1, 64, 1, 1), (64, 1, 1, 1), 128))
    r["data_ptr"] = per_call_us(lambda: base.data_ptr())
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "us": r}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
