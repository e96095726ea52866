"""Why a backend failed, read from the traceback torch logs with the failure. Pure, no torch.

Since torch 2.11 Dynamo answers a backend's exception with a graph break at the
failing code ("Backend compiler exception", GB0219), and the break repeats in every
frame around it: one failure, a dozen graph-break records, each saying only
"Backend compiler `inductor` failed with aten._local_scalar_dense.default". The
cause is in the traceback Dynamo logs before them ("WON'T CONVERT ..." records, and
the chained traceback of the innermost frame's record): the frame outside torch where
the exception was raised and, when the trace went through one, the registered backward
of a custom op (`torch.library`) that raised it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from fuselens.capture.frames import (is_custom_op_backward, is_torch_or_fuselens_file, make_location,
                                     traceback_frame)
from fuselens.events import SourceLocation

GB_TYPE = "Backend compiler exception"
_EXCEPTION_LINE = re.compile(r"^(?:[\w]+\.)*(?P<name>\w+(?:Exception|Error)): (?P<message>.+)$")
_BACKEND = re.compile(r"Backend compiler `(?P<backend>[^`]+)` failed with (?P<message>.+?)\. Adding a graph break")


@dataclass(frozen=True)
class BackendFailure:
    """One backend failure, as its traceback shows it."""

    exception: str  # "DataDependentOutputException: aten._local_scalar_dense.default"
    message: str  # what Dynamo's record quotes of it: "aten._local_scalar_dense.default"
    site: Optional[SourceLocation]  # the innermost frame outside torch, where it was raised
    custom_op_backward: bool  # raised inside a custom op's registered backward (torch/_library/autograd.py)


def read_failure(text: str) -> Optional[BackendFailure]:
    """The failure in a record that carries a backend's traceback, else None."""
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return None
    site: Optional[tuple[str, int, str]] = None
    through_backward = False
    in_custom_backward = False
    exception = message = ""
    # frames before the exception line, outermost first: the last outside torch raised it
    for line in text[start:].splitlines():  # the user code traceback before it is not the backend's
        frame = traceback_frame(line)
        if frame is not None:
            filename, _, function = frame
            if is_custom_op_backward(filename, function):
                in_custom_backward = True
            elif not is_torch_or_fuselens_file(filename):
                site, through_backward = frame, in_custom_backward
            continue
        m = _EXCEPTION_LINE.match(line.strip())
        if m and site is not None:  # the first exception: what a chained one says is Dynamo's
            exception = f"{m.group('name')}: {m.group('message').strip()}"[:300]
            message = m.group("message").strip()
            break
    if site is None or not exception:
        return None
    return BackendFailure(exception, message, make_location(*site), through_backward)


def failed_with(explanation: str) -> tuple[str, str]:
    """(backend, message) from a GB0219 record's explanation; ("", "") for another."""
    m = _BACKEND.search(explanation or "")
    return (m.group("backend"), m.group("message")) if m else ("", "")
