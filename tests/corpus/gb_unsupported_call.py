import os

import torch


def fn(x):
    y = x * 2
    os.getpid()
    return y + 1


if __name__ == "__main__":
    torch.compile(fn, backend="eager")(torch.randn(4))
