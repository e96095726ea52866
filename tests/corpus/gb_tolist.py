import torch


def fn(x):
    y = x * 2
    values = y.tolist()
    return y + len(values)


if __name__ == "__main__":
    torch.compile(fn, backend="eager")(torch.randn(5))
