"""fuselens demo: a small model with the three things fuselens explains.

    fuselens report examples/demo.py                 # fuselens' own compiler: kernels and every fusion decision
    FUSELENS_DEMO_BACKEND=inductor fuselens report examples/demo.py   # Inductor's kernels (~1 min compile on CPU)
    python examples/demo.py eager                    # first argument: any backend name

- a graph break: `.item()` inside forward (the scale is read back to Python),
- a recompile: batch size 4, then 7 (no mark_dynamic),
- fusable ops: a pointwise chain (gelu(x * w + b) * 0.5) and layernorm/softmax.
"""

import os
import sys

import torch
from torch import nn

BACKEND = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FUSELENS_DEMO_BACKEND", "fuselens")


class Attention(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return x + scores @ v


class DemoModel(nn.Module):
    def __init__(self, dim: int = 32):
        super().__init__()
        self.attn = Attention(dim)
        self.w = nn.Parameter(torch.randn(dim))
        self.b = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        h = self.attn(x)
        h = torch.nn.functional.gelu(h * self.w + self.b) * 0.5  # pointwise chain: one fused kernel
        scale = h.abs().max().item()  # graph break: a tensor value read back to Python
        return h / (scale + 1.0)


def main() -> None:
    torch.manual_seed(0)
    model = torch.compile(DemoModel(), backend=BACKEND)
    with torch.no_grad():
        for batch in (4, 7):  # the second batch size recompiles
            out = model(torch.randn(batch, 16, 32))
            print(f"batch {batch}: output {tuple(out.shape)}")


if __name__ == "__main__":
    main()
