"""A Triton driver that reports a Hopper CUDA target without a GPU (tests only).

Triton specializes and compiles CUDA kernels without a device (ptxas ships with
it), but asks its active driver for the current device and target first. With this
driver installed, CI's CPUs compile real sm_90 binaries; nothing can launch. It is
the edge of what CI can run: the compile pool's tests use it in the parent and in
the workers, the GPU run (benchmarks/gpu.py) covers launching what they compile.
"""

from __future__ import annotations

from typing import Any


class FakeCudaDriver:
    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)

    def is_active(self) -> bool:
        return True

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return self.target

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")


def install() -> None:
    from triton.runtime import driver

    driver.set_active(FakeCudaDriver())
