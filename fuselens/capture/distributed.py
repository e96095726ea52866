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

import asyncio
import dataclasses
import json
import os
import shlex
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
from fuselens.serialize import to_data

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
        """`fuselens report --nproc-per-node N train.py -- ARGS`: one host.
        `--standalone` lets torchrun pick a free port, so that two such runs
        (the editor's and a terminal's) never meet at the default 29500."""
        args = ["--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc_per_node), *target_argv]
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


def launch_for(spec: list[str], program_args: list[str], nproc_per_node: Optional[int] = None,
               run_dir: Optional[str] = None, cwd: Optional[str] = None) -> TorchrunLaunch:
    """The TorchrunLaunch of a command line, the one reading shared by
    `fuselens report`, `fuselens tui` and the language server's configured
    entry. `spec` is the target (`[script.py]` or `["-m", module]`) with
    `nproc_per_node`, or `[]` when `program_args` is a whole torchrun command
    (`torchrun ...` / `python -m torch.distributed.run ...`). Raises
    ValueError with a one-line message."""
    cwd = cwd or os.getcwd()
    if nproc_per_node is None:
        if spec:
            raise ValueError(f"{' '.join(spec)}: a torchrun command goes after -- without a target "
                             "(or give --nproc-per-node N with the target)")
        return TorchrunLaunch.from_command(program_args, run_dir=run_dir, cwd=cwd, shown=shlex.join(program_args))
    if nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    if not spec:
        raise ValueError("--nproc-per-node needs a target: a script.py or -m package.module")
    if spec[0].endswith(".ipynb"):
        raise ValueError("notebooks cannot run under torchrun; give a script")
    shown = shlex.join(["torchrun", "--nproc-per-node", str(nproc_per_node), *spec, *program_args])
    return TorchrunLaunch.from_nproc(nproc_per_node, [*spec, *program_args], run_dir=run_dir, cwd=cwd, shown=shown)


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
           "--options", json.dumps(to_data(options)), "--", *launch.torchrun_args]
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
    stop_leftovers(run_dir, launcher_pid=proc.pid)
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


async def analyze_distributed_async(launch: TorchrunLaunch, options: Optional[RunOptions] = None,
                                    cancel: Optional[threading.Event] = None) -> Report:
    """`analyze_distributed` for asyncio callers (the language server, the
    TUI). The run goes on in a thread; cancelling the awaiting task stops
    torchrun and its ranks there (SIGTERM, then SIGKILL after the grace)."""
    cancel = cancel or threading.Event()
    try:
        return await asyncio.to_thread(analyze_distributed, launch, options, cancel)
    except asyncio.CancelledError:
        cancel.set()
        raise


class DistributedSession:
    """A torchrun job run again on demand, for `fuselens tui`: the same
    interface as `WorkerSession` (`run_async`, `pid`, `close`). Unlike a
    single process, nothing stays alive between runs: each run is a new
    torchrun with new ranks, writing to its own run directory
    (`RUN_DIR/run-NNN` when the launch names one, else a temporary one)."""

    def __init__(self, launch: TorchrunLaunch) -> None:
        self.launch = launch
        self.runs = 0
        self._cancel: Optional[threading.Event] = None
        self._idle = threading.Event()
        self._idle.set()

    @property
    def pid(self) -> Optional[int]:
        """None: there is no one process to sample (py-spy follows one)."""
        return None

    def run_dir_of(self, run: int) -> Optional[str]:
        if self.launch.run_dir is None:
            return None
        return os.path.join(self.launch.run_dir, f"run-{run:03d}")

    async def run_async(self, options: Optional[RunOptions] = None, on_event: Any = None) -> Report:
        """Run the job once; the merged report of its ranks. `on_event` is
        accepted for the interface: ranks write files, not a live stream."""
        self.runs += 1
        launch = dataclasses.replace(self.launch, run_dir=self.run_dir_of(self.runs))
        self._cancel = cancel = threading.Event()
        self._idle.clear()

        def run() -> Report:
            try:
                return analyze_distributed(launch, options, cancel)
            finally:
                self._idle.set()

        try:
            return await asyncio.to_thread(run)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def close(self) -> None:
        """Stop a run in progress and wait until its processes are gone."""
        if self._cancel is not None:
            self._cancel.set()
        self._idle.wait(timeout=_STOP_GRACE_S + 10)


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


def stop_leftovers(run_dir: str, launcher_pid: Optional[int] = None) -> list[int]:
    """SIGKILL every rank of `run_dir` still alive on this host (by the pid
    its RankInfo recorded, checked against its command line so that a
    reused pid is left alone). With `launcher_pid`, only the ranks that
    launcher started (their `--request` names it): another launcher sharing
    the directory on this host, such as a second node of the same job, keeps
    its ranks. Returns the pids killed."""
    host = socket.gethostname()
    request = f"request-{host}-{launcher_pid}.json" if launcher_pid is not None else ""
    killed = []
    for stream in rankmerge.read_run_dir(run_dir).ranks:
        pid = stream.identity.pid
        if stream.identity.host != host or pid <= 0 or not _is_our_rank(pid, run_dir, request):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed


def _is_our_rank(pid: int, run_dir: str, request: str = "") -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
    except OSError:
        return False
    if b"fuselens.capture.rank" not in cmdline or run_dir.encode() not in cmdline:
        return False
    return not request or any(arg.endswith(request.encode()) for arg in cmdline)


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
