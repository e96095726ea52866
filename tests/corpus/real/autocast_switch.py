"""Evaluation with and without autocast on the same compiled model."""
import torch
from torch import nn

model = torch.compile(nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4)), backend="eager")

if __name__ == "__main__":
    x = torch.randn(8, 16)
    with torch.no_grad():
        full = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(x)
    print("max diff", (full - half.float()).abs().max().item() < 1.0)
