"""Mixture-of-experts style routing: tokens picked by nonzero."""
import torch
from torch import nn


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(8, 1)
        self.expert = nn.Linear(8, 8)

    def forward(self, x):
        picked = (self.gate(x).squeeze(-1) > 0).nonzero().squeeze(-1)
        out = x.clone()
        out[picked] = self.expert(x[picked])
        return out


if __name__ == "__main__":
    torch.manual_seed(0)
    model = torch.compile(Router(), backend="eager")
    with torch.no_grad():
        for _ in range(3):
            y = model(torch.randn(32, 8))
    print("routed", tuple(y.shape))
