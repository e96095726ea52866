"""Where a hung or crashed program was: Python's own stack dump.

The worker turns on `faulthandler` (fatal signals: SIGSEGV, SIGABRT, ...)
and registers SIGUSR1 with it, both writing to a file the parent names in
FUSELENS_FAULT_FILE. On a timeout the parent sends SIGUSR1 before the kill;
after a fatal signal the dump is already there. The parent reads the file
and points the finding at the user's innermost frame. No torch.
"""

from __future__ import annotations

import os
import re
import signal
from typing import Optional

from fuselens.capture.frames import is_user_file, make_location
from fuselens.events import SourceLocation

ENV = "FUSELENS_FAULT_FILE"
DUMP_SIGNAL = getattr(signal, "SIGUSR1", None)
_FRAME_RE = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<fn>\S+)')


def install_in_worker() -> None:
    """Worker side: dump Python stacks to $FUSELENS_FAULT_FILE on a fatal
    signal and on DUMP_SIGNAL. The file stays open for the worker's life."""
    import faulthandler

    path = os.environ.get(ENV)
    if not path:
        return
    try:
        out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - must outlive this call
    except OSError:
        return
    faulthandler.enable(file=out, all_threads=True)
    if DUMP_SIGNAL is not None:
        faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)


def user_location(text: str) -> Optional[SourceLocation]:
    """The innermost user frame of a faulthandler dump (each thread block
    lists the most recent call first); the first thread with one wins,
    which is the program's: the worker's own threads run no user code."""
    for block in re.split(r"\n(?=(?:Current thread|Thread) 0x)", text):
        for line in block.splitlines():
            m = _FRAME_RE.match(line)
            if m and is_user_file(m.group("file")):
                return make_location(m.group("file"), int(m.group("line")), m.group("fn"))
    return None


def read_location(path: Optional[str]) -> Optional[SourceLocation]:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return user_location(f.read())
    except OSError:
        return None
