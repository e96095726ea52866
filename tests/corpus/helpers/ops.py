import torch


def noisy_scale(x):
    y = x * 3
    torch._dynamo.graph_break()
    return y.tanh()
