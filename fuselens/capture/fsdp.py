"""Graph breaks at FSDP2's hooks, explained (pure: no torch).

`fully_shard` (torch.distributed.fsdp, FSDP2) runs its pre- and post-forward
hooks under `torch._dynamo.disable` (`_fsdp_common._dynamo_disable`, reason
"skipping FSDP hooks"). A torch.compile whose traced code calls a
fully_shard module therefore stops at that module's call: torch then says
"Attempted to call function marked as skipped ... `disable`", which names
neither FSDP nor what to do. The break's traceback ends inside
torch/distributed/fsdp, which is how it is recognised here.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

from fuselens.events import FixAdvice

_FSDP_DIR = os.sep + os.path.join("torch", "distributed", "fsdp") + os.sep

EXPLAINED = (
    "FSDP2 hooks: fully_shard runs its pre/post-forward hooks (all-gather and reshard of the "
    "parameters) under torch._dynamo.disable, so Dynamo stops at each call of a fully_shard "
    "module and that code runs eagerly"
)
FIX = FixAdvice(
    "fsdp-hooks",
    "compile the computation inside the sharded modules, not the fully_shard module that calls them",
    "e.g. block.forward = torch.compile(block.forward) for each sharded block (or torch.compile the block "
    "before fully_shard wraps it): the hooks then run outside the compiled code and every block's "
    "forward is one graph",
)


def hook_break(frames: Iterable[tuple[str, int, str]]) -> Optional[tuple[str, list[FixAdvice]]]:
    """(explanation, fixes) for a graph break whose traceback `frames`
    ((file, line, function), outermost first) ends in FSDP's code; None for
    any other break."""
    frames = list(frames or ())
    if frames and _FSDP_DIR in os.path.normpath(str(frames[-1][0])):
        return EXPLAINED, [FIX]
    return None
