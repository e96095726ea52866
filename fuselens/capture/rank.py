"""One torchrun rank under capture: `python -m fuselens.capture.rank --run-dir DIR`.

torchrun starts this module in place of the user's script (capture/launch.py
rewrites its command line), with RANK, LOCAL_RANK, WORLD_SIZE and GROUP_RANK
set as for any rank. It reads what to run from DIR/request.json, runs it in
the ordinary capture `Worker` (the same hooks as a single process), and
writes the event stream to DIR/rank-<RANK>.jsonl: the worker line format of
docs/events.md, each line also carrying `rank`, `local_rank` and `host`, so a
file from any host can be merged with the others. The first event is the
rank's `RankInfo`. Nothing is sent to the other ranks: fuselens adds no
collective to the program.

The rank exits with the program's exit code, so torchrun sees a failing rank
as failed and stops the others. A stop (SIGTERM from torchrun or the report
command, or the death of torchrun itself) is written down as a `killed`
error naming where the program was, before the rank exits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Optional

from fuselens.capture import frames as fr
from fuselens.capture.protocol import DONE, control_line
from fuselens.capture.rankmerge import fault_file
from fuselens.capture.target import RunOptions, Target
from fuselens.capture.worker import event_line
from fuselens.events import ErrorEntry, RankInfo, RunInfo, encode_event
from fuselens.serialize import from_data

REQUEST_FILE = "request.json"
_PARENT_POLL_S = 0.2


def rank_file(run_dir: str, rank: int) -> str:
    """Where rank `rank` writes its events (sorts by rank up to 100000 ranks)."""
    return os.path.join(run_dir, f"rank-{rank:05d}.jsonl")


def identity_from_env(env: Optional[dict[str, str]] = None) -> RankInfo:
    """This process' place in the job, as torchrun's environment says."""
    env = dict(os.environ if env is None else env)
    return RankInfo(
        rank=int(env.get("RANK", "0")),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        world_size=int(env.get("WORLD_SIZE", "1")),
        node_rank=int(env.get("GROUP_RANK", "0")),
        host=socket.gethostname(),
        pid=os.getpid(),
    )


class RankFile:
    """The rank's event file. Same interface as worker.Channel; every line
    gets the rank's identity appended to its JSON object."""

    def __init__(self, path: str, identity: RankInfo) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        tag = json.dumps({"rank": identity.rank, "local_rank": identity.local_rank, "host": identity.host})
        self._tag = ", " + tag[1:]  # '{"type": ..., "data": ...}' + tag -> one object
        self._lock = threading.Lock()

    def tagged(self, line: str) -> bytes:
        return (line.rstrip()[:-1] + self._tag + "\n").encode("utf-8")

    def send_line(self, line: str) -> None:
        data = self.tagged(line)
        with self._lock:
            os.write(self.fd, data)

    def send_now(self, line: str) -> None:
        """Write without the lock, from a signal handler (the interrupted main
        thread may hold it). The leading newline ends any line the main
        thread had half written; the reader counts that one as malformed."""
        os.write(self.fd, b"\n" + self.tagged(line))

    def event(self, event: Any) -> None:
        self.send_line(event_line(event))


class _Stopper:
    """Records how the rank was stopped, once, then ends the process."""

    def __init__(self, out: RankFile, identity: RankInfo) -> None:
        self.out = out
        self.identity = identity
        self.started = time.monotonic()
        self._once = threading.Lock()

    def stop(self, cause: str, code: int, frame: Any = None) -> None:
        if not self._once.acquire(blocking=False):
            return
        location = None
        if frame is not None:
            stack = traceback.extract_stack(frame)
            location = fr.innermost_user((f.filename, f.lineno or 0, f.name) for f in stack)
        where = f" while at line {location.line} ({location.function})" if location else ""
        message = f"rank {self.identity.rank} was stopped by {cause}{where}"
        try:
            self.out.send_now(encode_event(ErrorEntry("killed", message, location=location)))
            self.out.send_now(encode_event(RunInfo(target="", exit_code=code)))
            self.out.send_now(control_line(DONE, wall_s=round(time.monotonic() - self.started, 6)))
        finally:
            os._exit(128 - code if code < 0 else code)

    def on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.stop(f"{name} (torchrun stops all ranks when one fails; the report command on --timeout)", -signum, frame)

    def watch_parent(self) -> None:
        """torchrun killed outright cannot stop its ranks: a rank whose parent
        is gone stops itself instead of running on unobserved."""
        parent = os.getppid()
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent:
                self.stop("the death of its torchrun agent", -signal.SIGKILL)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuselens.capture.rank")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--request", help="what to run (JSON: target, options); default DIR/request.json")
    args = parser.parse_args(argv)
    with open(args.request or os.path.join(args.run_dir, REQUEST_FILE), encoding="utf-8") as f:
        request = json.load(f)
    target = from_data(Target, request["target"])
    options = from_data(RunOptions, request.get("options") or {})
    identity = identity_from_env()
    events_path = rank_file(args.run_dir, identity.rank)
    out = RankFile(events_path, identity)
    from fuselens.capture import faultstack

    os.environ[faultstack.ENV] = fault_file(events_path)
    faultstack.install_in_worker()  # a segfault names the line it was on (read when merging)
    out.event(identity)
    stopper = _Stopper(out, identity)
    signal.signal(signal.SIGTERM, stopper.on_signal)
    signal.signal(signal.SIGINT, stopper.on_signal)
    threading.Thread(target=stopper.watch_parent, name="fuselens-parent-watch", daemon=True).start()

    from fuselens.capture.worker import Worker  # imports torch

    Worker.marks_output_end = False
    worker = Worker(out)  # type: ignore[arg-type]  (RankFile is a Channel)
    info = worker.run(target, options)
    code = info.exit_code or 0
    try:  # no crash: an empty dump file is only clutter in the run directory
        if os.path.getsize(os.environ[faultstack.ENV]) == 0:
            os.remove(os.environ[faultstack.ENV])
    except OSError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: the program's atexit handlers and non-daemon threads already
    # had their chance inside the run; torchrun needs the code, nothing more.
    os._exit(code if 0 <= code < 256 else 1)


if __name__ == "__main__":
    sys.exit(main())
