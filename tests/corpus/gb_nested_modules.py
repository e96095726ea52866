import torch
from torch import nn


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        print("inner", h.shape)
        return torch.relu(h)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.inner(x))


def fn(x):
    return MODEL(x)


MODEL = Outer()

if __name__ == "__main__":
    model = torch.compile(MODEL, backend="eager")
    with torch.no_grad():
        model(torch.randn(3, 8))
