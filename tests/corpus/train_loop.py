import sys

import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = torch.compile(model, backend="eager")

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
for i in range(steps):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    loss = ((step(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("finished all steps", steps)
