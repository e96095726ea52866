"""The wire between the parent (runner) and the worker. No torch here.

Two pipes besides the program's own stdin/stdout/stderr:

- control (parent -> worker): one JSON object per line,
  `{"op": "run", "target": {...Target}, "options": {...RunOptions}}`.
  EOF on the control pipe tells the worker to exit.
- events (worker -> parent): one JSON line per schema event
  (`fuselens.events.encode_event`), plus control lines whose `type` starts
  with `__`: `__started__` when the user program begins, `__done__` (with
  `wall_s`) when it ended, whatever the way.
"""

from __future__ import annotations

import json
from typing import Any

STARTED = "__started__"
DONE = "__done__"
READY = "__ready__"
# Written by the worker to its stdout and stderr after a run, before `__done__`: the
# parent's drain threads may still be reading the program's last output when
# `__done__` arrives on the events pipe; the tails are complete once each ends with
# this (then stripped). Record-separator bytes: no program prints them by accident.
OUTPUT_END = b"\x1e__fuselens_output_end__\x1e\n"


def control_line(kind: str, **data: Any) -> str:
    """A worker -> parent control line (not a schema event)."""
    return json.dumps({"type": kind, "data": data})


def run_request(target: dict[str, Any], options: dict[str, Any]) -> str:
    """A parent -> worker request to run `target` once with `options`."""
    return json.dumps({"op": "run", "target": target, "options": options}) + "\n"
