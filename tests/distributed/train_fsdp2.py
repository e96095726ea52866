"""FSDP2 (`torch.distributed.fsdp.fully_shard`) with a compiled model on CPU/gloo,
for fuselens' distributed tests. Prints `rank N step S loss L` per step.

  --compile root     torch.compile the fully_shard root (Dynamo stops at FSDP2's hooks)
  --compile layers   torch.compile each sharded layer's forward (the hooks run outside it)
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="eager")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--compile", choices=("root", "layers"), default="root")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    if args.compile == "root":
        compiled = torch.compile(model, backend=args.backend)
    else:
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.forward = torch.compile(layer.forward, backend=args.backend)
        compiled = model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        x = torch.randn(8, 32, generator=gen)
        loss = compiled(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
