"""PyTorch's 'Compiling the optimizer' recipe with an LR schedule: the step compiled alone."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))


@torch.compile(backend="eager")
def opt_step():
    opt.step()


if __name__ == "__main__":
    for i in range(4):
        loss = nn.functional.mse_loss(model(torch.randn(16, 8)), torch.randn(16, 1))
        loss.backward()
        opt_step()
        sched.step()
        opt.zero_grad()
    print("final loss", round(float(loss), 3))
