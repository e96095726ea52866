"""Is a program's exception a crash that happens only under torch.compile?
Pure, no torch.

It is when the exception was raised inside the compiler: its traceback runs
from the user's innermost frame on into torch._dynamo, torch._inductor or
fuselens' own compiler, or it is one of the errors Dynamo wraps compile
failures in (BackendCompilerFailed, TorchRuntimeError). An exception raised
by the user's own line is not, even when that line runs inside a compiled
function (Dynamo's frames are then outside the user's innermost frame).
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Optional

from fuselens.capture import frames as fr

COMPILE_ERRORS = ("BackendCompilerFailed", "TorchRuntimeError", "InternalTorchDynamoError")
# Path pieces of the compiler's packages -> the name a user knows them by.
_COMPILER_DIRS = (
    (f"{os.sep}torch{os.sep}_dynamo{os.sep}", "torch._dynamo"),
    (f"{os.sep}torch{os.sep}_inductor{os.sep}", "torch._inductor"),
    (f"{os.sep}fuselens{os.sep}compiler{os.sep}", "fuselens.compiler"),
)

Frame = tuple[str, int, str]  # (filename, line, function), outermost first
# Dynamo's messages end with the user line it was tracing.
_FROM_USER = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>[\w<>.]+)')
# Entry points that only pass a compile error on: they say nothing about where.
_ENTRY_FILES = ("eval_frame.py", "convert_frame.py")


def compiler_package(filename: str) -> str:
    """"torch._dynamo", "torch._inductor", "fuselens.compiler" or ""."""
    path = os.path.normpath(filename or "")
    return next((name for piece, name in _COMPILER_DIRS if piece in path), "")


def traced_line(message: str) -> str:
    """"step at f.py:9" from the user-code lines Dynamo appends to its
    errors (the innermost one), "" when there are none."""
    tail = message.split("from user code:", 1)
    found = list(_FROM_USER.finditer(tail[1])) if len(tail) == 2 else []
    if not found:
        return ""
    m = found[-1]
    return f"{m.group('fn')} at {os.path.basename(m.group('file'))}:{m.group('line')}"


def compile_site(chain: Iterable[tuple[list[str], list[Frame]]], message: str = "") -> Optional[str]:
    """Where in the compiler an exception was raised, or None when it was not.
    `chain` is the exception then its causes, each as (type names, its MRO
    first; traceback frames, outermost first). The answer names the
    compiler's package and its innermost frame there, e.g.
    "torch._inductor (lowering.py:412 in make_pointwise)", or with the user
    line Dynamo was tracing (from `message`, the full exception text),
    "torch._dynamo, tracing step at f.py:9"."""
    typed = False
    site: Optional[str] = None
    for names, frames in chain:
        typed = typed or any(n in COMPILE_ERRORS for n in names)
        last_user = max((i for i, f in enumerate(frames) if fr.is_user_file(f[0])), default=-1)
        inner = [f for f in frames[last_user + 1:] if compiler_package(f[0])]
        if inner:  # the deepest cause that ran in the compiler says where best
            file, line, function = inner[-1]
            here = os.path.basename(file)
            site = compiler_package(file) + ("" if here in _ENTRY_FILES else f" ({here}:{line} in {function})")
    if site is None and typed:
        site = "torch.compile"
    traced = traced_line(message)
    return f"{site}, tracing {traced}" if site and traced else site


def labelled(message: str, site: str) -> tuple[str, str]:
    """(message, explanation) of an exception raised inside the compiler."""
    return (f"fails only under torch.compile (raised in {site}): {message}",
            "It raised inside the compiler, not on a line of yours. Run with `--backend eager` to confirm: "
            "if it passes, the backend is at fault; if not, TORCH_COMPILE_DISABLE=1 runs it without compiling.")
