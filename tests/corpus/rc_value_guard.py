import torch


def fn(x, n):
    return x * n + 1


if __name__ == "__main__":
    f = torch.compile(fn, backend="eager")
    f(torch.randn(4), 2)
    f(torch.randn(4), 3)
    f(torch.randn(4), 4)
