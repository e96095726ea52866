"""A step counter kept in a global dict, bumped inside compiled code."""
import torch

STATS = {"calls": 0}


@torch.compile(backend="eager")
def scale(x):
    STATS["calls"] += 1
    return x * STATS["calls"]


if __name__ == "__main__":
    for _ in range(5):
        out = scale(torch.ones(4))
    print("calls", STATS["calls"], "last", out.sum().item())
