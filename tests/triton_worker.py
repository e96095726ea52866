"""Runs a Triton test module's worker in a subprocess under TRITON_INTERPRET=1:
the interpreter must be chosen before triton is imported, and pytest may have
imported it already. `interpreted_worker_records` is the test's side,
`worker_main` the worker's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]


def interpreted_worker_records(test_file: str, out: Path, timeout: int, what: str) -> dict:
    """Run `python test_file --worker out` in the interpreter; the records it wrote."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, test_file, "--worker", str(out)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))
    if not out.exists():
        pytest.fail(f"{what} crashed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def worker_main(records: Callable[[dict], Any], cache_prefix: str) -> None:
    """When the module runs as `python test_file --worker OUT`: `records(opts)` of a
    Triton-target compile with a fresh cache directory, written to OUT as JSON."""
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        opts = {"target": "triton", "fallback_on_error": False, "cache_dir": tempfile.mkdtemp(prefix=cache_prefix)}
        Path(sys.argv[2]).write_text(json.dumps(records(opts)))
