"""Worker side: graph breaks that torch makes on purpose, in its own code (GraphBreak.origin).

Such a break is by design: the program compiles as torch means it to, and no edit of the
user's code removes it. The views list these apart from the program's graph breaks, count
them as no finding, and offer no fix.

- "ddp-wrapper": inside DistributedDataParallel's forward wrapper (its logger,
  `_inside_ddp_forward`), which Dynamo deliberately does not trace.
- "optimizer-step": torch's optimizers call `torch._dynamo.graph_break()` around their step
  (torch/optim/optimizer.py `_use_grad`: so that AOTAutograd compiles the update as an
  inference graph, with no gradients), and an LR scheduler wraps `opt.step` in a function
  Dynamo skips (torch/optim/lr_scheduler.py). The update itself still compiles as one graph.
  Seen as graph breaks at `opt.step()` even where the step is compiled alone, as PyTorch's
  "Compiling the optimizer" recipe does.
"""

from __future__ import annotations

import os
from typing import Any

from fuselens.events import ORIGIN_DDP_WRAPPER as DDP_WRAPPER
from fuselens.events import ORIGIN_OPTIMIZER_STEP as OPTIMIZER_STEP

_DDP_WRAPPER_FILE = os.path.join("torch", "nn", "parallel", "distributed.py")
_OPTIM_DIR = os.path.join("torch", "optim") + os.sep


def break_origin(frames: Any, explanation: str = "") -> str:
    """GraphBreak.origin of a break whose traceback is `frames` ((file, line, function)
    tuples, outermost first) and whose Dynamo explanation is `explanation`; "" for a break
    in the program's own code."""
    if "`DistributedDataParallel._" in explanation:
        # DDP's private helpers are skipped on purpose; the traceback then ends at the
        # user's call of the module
        return DDP_WRAPPER
    frames = list(frames or ())
    # only the innermost frame counts: a user model called *through* DDP (or a closure an
    # optimizer calls) has torch's frames further out, and its breaks are the user's
    inner = str(frames[-1][0]) if frames else ""
    if inner.endswith(_DDP_WRAPPER_FILE):
        return DDP_WRAPPER
    skipped_optim = "should not be traced" in explanation and _OPTIM_DIR in explanation.replace("/", os.sep)
    if _OPTIM_DIR in inner.replace("/", os.sep) or skipped_optim:
        return OPTIMIZER_STEP
    return ""
