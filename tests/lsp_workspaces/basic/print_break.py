import torch


@torch.compile(backend="eager")
def noisy(x):
    y = x.sin()
    print("tracing")
    return y.cos()


noisy(torch.randn(4))
