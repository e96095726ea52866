import torch


def fn(x):
    return torch.sin(x) * 2 + 1


if __name__ == "__main__":
    f = torch.compile(fn, backend="eager")
    f(torch.randn(4, 3))
    f(torch.randn(7, 3))
    f(torch.randn(9, 3))
