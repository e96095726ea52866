"""A training loop that would run for a long time; analyse a few steps only:

    fuselens report examples/train_loop.py --max-calls 3

The compiled model (and `torch.compile`d loss) stop being called after three
steps: fuselens stops the program there and reports what compiled.
"""

import os

import torch
from torch import nn

BACKEND = os.environ.get("FUSELENS_DEMO_BACKEND", "eager")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x)


@torch.compile(backend=BACKEND)
def loss_fn(pred, target):
    return torch.nn.functional.mse_loss(pred, target)


def main(steps: int = 100_000) -> None:
    model = torch.compile(MLP(), backend=BACKEND)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(steps):
        x, y = torch.randn(64, 16), torch.randn(64, 1)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 1000 == 0:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
