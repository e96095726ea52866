import torch


def fn(x):
    y = x.sin()
    print("inside compiled code")
    return y * 2


if __name__ == "__main__":
    f = torch.compile(fn, backend="eager")
    for _ in range(3):
        f(torch.randn(8))
