import torch


@torch.compile(backend="eager")
def total(x):
    s = x.sum().item()
    return x * s


@torch.compile(backend="eager")
def noisy(x):
    y = x.sin()
    print("tracing ✓ 😀")
    return y.cos()


@torch.compile(backend="eager")
def pick(x):
    if x.sum() > 0:
        return x.sin()
    return x.cos()


total(torch.randn(4))
noisy(torch.randn(4))
pick(torch.randn(4))
