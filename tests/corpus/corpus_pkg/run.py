import sys

import torch


def fn(x):
    return x.sum().item() + len(sys.argv)


if __name__ == "__main__":
    print("argv", sys.argv[1:])
    torch.compile(fn, backend="eager")(torch.ones(3))
