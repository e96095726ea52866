import torch

from helpers.ops import noisy_scale


def fn(x):
    return noisy_scale(x) + 1


if __name__ == "__main__":
    torch.compile(fn, backend="eager")(torch.randn(4))
