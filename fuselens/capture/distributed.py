"""Parent side of a distributed capture: run torchrun with every rank under
capture, stop it cleanly, merge the ranks. Never imports torch.

`analyze_distributed(launch, options)` starts
`python -m fuselens.capture.launch` (torchrun with capture/rank.py as each
rank's program) in its own process group, waits for it (or for
`options.timeout_s`), writes what it saw to `DIR/launch-<host>-<pid>.jsonl`
and returns the merged Report of `DIR` (capture/rankmerge.py).

Stopping: on timeout or cancel the launcher gets SIGTERM, which torchrun
turns into SIGTERM to every rank (each rank writes where it was); whatever is
still alive after a grace period (the launcher's group, and every rank by the
pid it recorded) gets SIGKILL. Ranks also stop themselves when their torchrun
agent dies. Nothing of the run is left running when this returns.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from fuselens.capture import rankmerge
from fuselens.capture.runner import _drain, _Tail, _worker_env
from fuselens.capture.target import RunOptions
from fuselens.events import ErrorEntry, Report, RunInfo, encode_event

_STOP_GRACE_S = 15.0  # torchrun's SIGTERM -> ranks -> exit, before SIGKILL
_POLL_S = 0.2


@dataclass
class TorchrunLaunch:
    """A torchrun command line, as the user would type it after `torchrun`:
    launcher options, then the script (or `-m module`) and its arguments."""

    torchrun_args: list[str]
    run_dir: Optional[str] = None  # where ranks write; a fresh temporary directory when None
    cwd: Optional[str] = None
    shown: str = ""  # the command as the user wrote it, for the report

    @classmethod
    def from_nproc(cls, nproc_per_node: int, target_argv: list[str], **kw: object) -> "TorchrunLaunch":
        """`fuselens report --nproc-per-node N train.py -- ARGS`: one host."""
        args = ["--nnodes", "1", "--nproc-per-node", str(nproc_per_node), *target_argv]
        return cls(args, **kw)  # type: ignore[arg-type]

    @classmethod
    def from_command(cls, command: list[str], **kw: object) -> "TorchrunLaunch":
        """`torchrun ARGS` or `python -m torch.distributed.run ARGS`."""
        head = command[:1]
        if head and os.path.basename(head[0]) == "torchrun":
            return cls(command[1:], **kw)  # type: ignore[arg-type]
        if len(command) >= 3 and command[1] == "-m" and command[2] in ("torch.distributed.run", "torch.distributed.launch"):
            return cls(command[3:], **kw)  # type: ignore[arg-type]
        raise ValueError(f"not a torchrun command: {' '.join(command[:3])} (expected torchrun ... or python -m torch.distributed.run ...)")


def is_torchrun_command(argv: list[str]) -> bool:
    """Whether `argv` (what follows `fuselens report --`) launches torchrun."""
    try:
        TorchrunLaunch.from_command(argv)
        return True
    except ValueError:
        return False


@dataclass
class _Outcome:
    exit_code: Optional[int] = None
    timed_out: bool = False
    cancelled: bool = False
    errors: list[ErrorEntry] = field(default_factory=list)


def analyze_distributed(launch: TorchrunLaunch, options: Optional[RunOptions] = None,
                        cancel: Optional[threading.Event] = None,
                        echo: Optional[tuple[Any, Any]] = None) -> Report:
    """Run the torchrun job under capture and return the merged Report.
    Never raises for what the program does; `cancel.set()` stops the run.
    `echo=(out, err)` passes the job's stdout and stderr (torchrun's and
    every rank's) through to these streams as it runs, as `analyze` does."""
    options = options or RunOptions()
    run_dir = os.path.abspath(launch.run_dir or tempfile.mkdtemp(prefix="fuselens-run-"))
    os.makedirs(run_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "fuselens.capture.launch", "--run-dir", run_dir,
           "--options", json.dumps(options.to_dict()), "--", *launch.torchrun_args]
    env = _worker_env(options.env)
    proc = subprocess.Popen(cmd, cwd=launch.cwd or None, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out, err = _Tail(options.output_limit_bytes), _Tail(options.output_limit_bytes)
    if echo is not None:
        out.echo, err.echo = echo
    threads = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True)]
    for t in threads:
        t.start()
    outcome = _wait(proc, options.timeout_s, cancel)
    stop_leftovers(run_dir)
    for t in threads:
        t.join(timeout=5)
    if outcome.exit_code == 2 and not _has_rank_files(run_dir):
        # The launcher refused the command line (its message is on stderr).
        outcome.errors.append(ErrorEntry("exit", "fuselens could not launch torchrun: "
                                         + (err.text().strip().splitlines() or ["no message"])[-1]))
    info = RunInfo(target=launch.shown or " ".join(launch.torchrun_args), target_kind="script",
                   backend=options.backend or "", exit_code=outcome.exit_code,
                   stdout_tail=out.text(), stderr_tail=err.text())
    _write_launch_record(run_dir, info, outcome.errors)
    try:
        return rankmerge.merge_run_dir(run_dir)
    except FileNotFoundError:
        # No rank ever started: the report is what the launcher saw.
        errors = outcome.errors or [ErrorEntry("exit", f"torchrun exited with code {outcome.exit_code} before any rank started")]
        return Report(run=info, errors=errors)


def _wait(proc: subprocess.Popen, timeout_s: Optional[float], cancel: Optional[threading.Event]) -> _Outcome:
    outcome = _Outcome()
    deadline = time.monotonic() + timeout_s if timeout_s else None
    try:
        while proc.poll() is None:
            if cancel is not None and cancel.is_set():
                outcome.cancelled = True
                break
            if deadline is not None and time.monotonic() >= deadline:
                outcome.timed_out = True
                break
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        outcome.cancelled = True
    if outcome.timed_out or outcome.cancelled:
        _stop(proc)
        why = (f"the run was stopped after the {timeout_s:g} s timeout (--timeout counts from the launch)"
               if outcome.timed_out else "the run was cancelled")
        outcome.errors.append(ErrorEntry("timeout" if outcome.timed_out else "killed", why))
    outcome.exit_code = proc.wait()
    return outcome


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to torchrun (it stops its ranks), SIGKILL to its group after the grace."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=_STOP_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_leftovers(run_dir: str) -> list[int]:
    """SIGKILL every rank of `run_dir` still alive on this host (by the pid
    its RankInfo recorded, checked against its command line so that a
    reused pid is left alone). Returns the pids killed."""
    host = socket.gethostname()
    killed = []
    for stream in rankmerge.read_run_dir(run_dir).ranks:
        pid = stream.identity.pid
        if stream.identity.host != host or pid <= 0 or not _is_our_rank(pid, run_dir):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed


def _is_our_rank(pid: int, run_dir: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
    except OSError:
        return False
    return b"fuselens.capture.rank" in cmdline and run_dir.encode() in cmdline


def _has_rank_files(run_dir: str) -> bool:
    return bool(rankmerge.read_run_dir(run_dir).ranks)


def _write_launch_record(run_dir: str, info: RunInfo, errors: list[ErrorEntry]) -> None:
    path = os.path.join(run_dir, f"launch-{socket.gethostname()}-{os.getpid()}.jsonl")
    try:
        with open(path, "w", encoding="utf-8") as f:
            for event in [info, *errors]:
                f.write(encode_event(event) + "\n")
    except OSError:
        pass  # the report is still returned; only `--merge` of this directory loses the launcher's view
