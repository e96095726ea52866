import torch


def fn(x):
    return x.relu() + 1


if __name__ == "__main__":
    f = torch.compile(fn, backend="eager")
    f(torch.randn(4))
    f(torch.randn(4, dtype=torch.float64))
