"""A small DDP training loop for fuselens' distributed tests (CPU, gloo).

Launched by torchrun (RANK, WORLD_SIZE, MASTER_ADDR... come from it). Flags
make one rank misbehave so that tests can prove what the merged report says:

  --backend NAME        torch.compile backend (eager, aot_eager, inductor, fuselens)
  --bucket-cap-mb MB    DDP bucket size; a small one makes Dynamo split the graph
  --break-on-rank R     rank R takes a graph break (a print inside the model)
  --crash-on-rank R     rank R raises after its first step
  --hang-on-rank R      rank R sleeps forever after its first step
  --kill-on-rank R      rank R SIGKILLs itself after its first step (no Python cleanup)
  --no-compile          plain eager DDP (the baseline for overhead measurements)

Prints one `rank N step S loss L` line per step: the tests compare losses
between backends.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self, width: int, break_here: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(4))
        self.head = nn.Linear(width, 1)
        self.break_here = break_here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x))
            if self.break_here and i == 1:
                print("rank-local debug print")  # a graph break on this rank only
        return self.head(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="eager")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--break-on-rank", type=int, default=-1)
    p.add_argument("--crash-on-rank", type=int, default=-1)
    p.add_argument("--hang-on-rank", type=int, default=-1)
    p.add_argument("--kill-on-rank", type=int, default=-1)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net(args.width, break_here=rank == args.break_on_rank)
    ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb)
    step_fn = ddp if args.no_compile else torch.compile(ddp, backend=args.backend)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(args.steps):
        x = torch.randn(16, args.width, generator=gen)
        y = torch.randn(16, 1, generator=gen)
        loss = nn.functional.mse_loss(step_fn(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
        if rank == args.crash_on_rank:
            raise RuntimeError(f"rank {rank} failed on purpose")
        if rank == args.kill_on_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == args.hang_on_rank:
            while True:
                time.sleep(1)
    dist.barrier()
    dist.destroy_process_group()
    if os.environ.get("TRAIN_DDP_SAY_DONE"):
        print(f"rank {rank} done")


if __name__ == "__main__":
    main()
