import torch


@torch.compile(backend="eager")
def pick(x):
    if x.sum() > 0:
        return x.sin()
    return x.cos()


pick(torch.randn(4))
