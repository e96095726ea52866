"""A program with one graph break: print() inside a compiled function."""
import torch


def step(x):
    y = torch.sin(x) * 2
    print("halfway")  # Dynamo cannot trace print: the graph breaks here
    return torch.cos(y)


compiled = torch.compile(step)
compiled(torch.randn(16))
