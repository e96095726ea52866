import torch

def broken(:
    return 1
