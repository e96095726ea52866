import torch


def fn(x):
    scale = x.abs().max().item()
    return x / scale


if __name__ == "__main__":
    f = torch.compile(fn, backend="eager")
    f(torch.randn(8))
    f(torch.randn(8))
