"""Raises on the user's own line inside a compiled function: this fails in
plain Python too, so it must not be labelled a compile-only crash."""
import torch


@torch.compile(backend="eager")
def check(x):
    if x.shape[0] != 3:
        raise ValueError("expected 3 rows")
    return x + 1


check(torch.randn(4))
