import torch

torch._dynamo.config.automatic_dynamic_shapes = False
torch._dynamo.config.recompile_limit = 2


def fn(x):
    return x.exp() - 1


if __name__ == "__main__":
    f = torch.compile(fn, backend="eager")
    for size in (2, 3, 4, 5):
        f(torch.randn(size))
