import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.fc(self.norm(x)))


MODEL = Block()


def fn(x):
    return MODEL(x)


if __name__ == "__main__":
    model = torch.compile(MODEL, backend="eager")
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 16))
