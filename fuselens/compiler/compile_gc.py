"""Python's garbage collector during a compile: the objects alive before it are not scanned.

A full collection walks every object the process holds: torch, transformers, the
model, Dynamo's trace (half a million objects for a BERT training step). A compile
makes objects fast enough (sympy expressions above all) that the collector runs full
passes during it: in BERT's training step (6 layers, CPU) three took 0.79 s of the
first call. Objects older than the compile are frozen for its duration (`gc.freeze`),
so those passes scan only what the compile made (0.11 s); after it they are
collectable again, and their garbage goes at the next full pass as before.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_depth = 0  # compiles in progress (a backward compiled while its forward's compile runs)
_ours = False  # whether we froze: a program that froze objects itself keeps them frozen


@contextlib.contextmanager
def old_objects_frozen() -> Iterator[None]:
    global _depth, _ours
    with _lock:
        _depth += 1
        if _depth == 1:
            _ours = gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _ours:
                gc.unfreeze()
                _ours = False
