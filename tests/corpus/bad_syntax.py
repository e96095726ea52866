import torch


def fn(x)
    return x + 1
