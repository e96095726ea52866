"""A whole training step compiled, optimizer.step() included."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)


@torch.compile(backend="eager")
def train_step(x, y):
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


if __name__ == "__main__":
    for i in range(6):
        loss = train_step(torch.randn(16, 8), torch.randn(16, 1))
    print("final loss", round(float(loss), 3))
