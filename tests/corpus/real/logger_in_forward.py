"""A model that logs from its forward, as library models do (transformers' warning_once)."""
import logging

import torch
from torch import nn

log = logging.getLogger("mylib")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        log.warning("Block: the legacy path is deprecated")
        return self.lin(x).relu() * 2


model = torch.compile(Block(), backend="eager")

if __name__ == "__main__":
    for i in range(3):
        out = model(torch.randn(4, 16))
    print("sum", round(float(out.sum()), 3) > -1)
