"""Runs in plain Python; under torch.compile(fullgraph=True) the print is a
graph break that fullgraph forbids, so it raises inside torch._dynamo."""
import torch


@torch.compile(backend="eager", fullgraph=True)
def step(x):
    y = x.sin()
    print("step")
    return y + 1


step(torch.randn(4))
