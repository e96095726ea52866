# A latin-1 file without a coding line: CPython refuses it (PEP 263).
import torch

print("café", torch.ones(1))  # é is latin-1, not UTF-8
