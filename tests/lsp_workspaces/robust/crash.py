import torch


def helper(x):
    raise ValueError("boom from the user program")


@torch.compile(backend="eager")
def f(x):
    return x + 1


f(torch.randn(2))
helper(1)
