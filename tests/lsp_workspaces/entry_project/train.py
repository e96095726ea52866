import argparse

import torch

from model import step

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
args = parser.parse_args()
for i in range(args.steps):
    step(torch.randn(4 * (i + 1), 2))
