"""Graph breaks a model picks up easily: a data-dependent `if`, `.tolist()`,
and a value guard on a Python int (each new `k` recompiles).

    fuselens report examples/data_dependent.py
"""

import torch

BACKEND = "eager"


@torch.compile(backend=BACKEND)
def topk_mask(x, k):
    if x.mean() > 0:  # data-dependent branch: graph break
        x = x - x.mean()
    idx = x.topk(k).indices.tolist()  # .tolist(): graph break
    mask = torch.zeros_like(x)
    mask[idx] = 1.0
    return x * mask


if __name__ == "__main__":
    for k in (2, 3, 4):
        topk_mask(torch.randn(16), k)
