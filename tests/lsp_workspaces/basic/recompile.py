import torch


@torch.compile(backend="eager")
def scale(x):
    return x * 2 + 1


for n in (4, 8, 16):
    batch = torch.randn(n, 3)
    scale(batch)
