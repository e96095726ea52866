"""Workers die with the process that started them, whatever kills it.

A worker runs the user's program; if the server or TUI that started it is
killed (SIGKILL gives it no chance to clean up), the worker must not keep
running that program forever. Two mechanisms, because neither covers all:

* Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`), set in the
  child at its start: the kernel kills the worker the moment its parent dies.
  The kernel ties it to the parent *thread* that forked, so it is used only
  when the parent started the worker from its main thread (a worker started
  from a short-lived thread would otherwise die with that thread).
* A watchdog thread that checks every 0.2 s whether the parent is still the
  parent (`os.getppid()` changes when it dies) and then SIGKILLs the worker's
  own process group: the program and everything it started.

The parent passes its pid in the environment (`child_env`); the child takes it
out at once (`die_with_parent`) so the user's own subprocesses do not inherit it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Optional

ENV = "FUSELENS_PARENT"
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.2


def child_env() -> dict[str, str]:
    """Environment entries for a worker started now from this thread."""
    main = threading.current_thread() is threading.main_thread()
    return {ENV: f"{os.getpid()}:{int(main)}"}


def die_with_parent(poll_s: float = _POLL_S) -> Optional[int]:
    """In a worker: arrange to die when the parent named by `child_env` dies.
    Returns the watched pid (None when started by something else)."""
    value = os.environ.pop(ENV, "")
    pid_text, _, main = value.partition(":")
    if not pid_text.isdigit():
        return None
    parent = int(pid_text)
    if main == "1" and sys.platform.startswith("linux"):
        _set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # died before we could watch it
        _die()
    threading.Thread(target=_watch, args=(parent, poll_s), name="fuselens-parent-watch", daemon=True).start()
    return parent


def _set_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, poll_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(poll_s)
    _die()


def _die() -> None:
    """SIGKILL our process group when we lead it (the worker runs in a session
    of its own, so that is the program and its children), else just us."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)
