import torch


def fn(x):
    y = x.cos()
    if y.sum() > 0:
        return y + 1
    return y - 1


if __name__ == "__main__":
    f = torch.compile(fn, backend="eager")
    f(torch.randn(6))
