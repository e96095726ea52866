"""Parent side of capture: start the worker, feed it a run, fold its events.

Never imports torch (the server and TUI call this). The user program runs in
`python -m fuselens.capture.worker`, in its own process group so that a
timeout or a cancel kills the program and anything it started. The child's
stdout/stderr are drained by threads into bounded tails: a program printing
megabytes neither blocks on a full pipe nor grows the parent.
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import functools
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

# Siblings by module path, never through the package: fuselens.capture's
# __init__ imports this module.
import fuselens.capture.faultstack as faultstack
from fuselens import parent_watch
from fuselens.capture.assemble import ReportBuilder
from fuselens.capture.protocol import DONE, OUTPUT_END, STARTED, run_request
from fuselens.capture.target import RunOptions, Target
from fuselens.events import ErrorEntry, Report, RunInfo, decode_event
from fuselens.serialize import to_data

EventCallback = Callable[[Any], None]

# Where the fuselens package lives: the worker must import it from any cwd.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_POLL_S = 0.2  # how often a blocked read checks for cancel/deadline
_MAX_LINE = 256 * 1024 * 1024  # a runaway line is dropped, not buffered forever
_STARTUP_S = 120.0  # worker start (torch import) allowed on top of a timeout
_OUTPUT_END_WAIT_S = 5.0  # for the drain threads to reach the end-of-run marker


class _Tail:
    """The last `limit` bytes written to a stream, filled by a drain thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Where to pass the program's output through as it runs (the report
        # CLI's terminal); None keeps it only in the tail.
        self.echo: Optional[Any] = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = bytearray()
        self._lock = threading.Condition()
        self._ended = False

    def reset(self, limit: int) -> None:
        with self._lock:
            self.limit = limit
            self._buf.clear()
            self._ended = False

    def feed(self, chunk: bytes) -> None:
        if self.echo is not None:
            try:
                self.echo.write(self._decoder.decode(chunk.replace(OUTPUT_END, b"")))
                self.echo.flush()
            except (OSError, ValueError):
                self.echo = None
        with self._lock:
            self._buf += chunk
            if self._buf.endswith(OUTPUT_END):
                del self._buf[-len(OUTPUT_END):]
                self._ended = True
                self._lock.notify_all()
            if len(self._buf) > self.limit:
                del self._buf[: len(self._buf) - self.limit]

    def wait_end(self, timeout: float) -> bool:
        """Wait until the worker's end-of-run marker came through this stream."""
        with self._lock:
            return self._lock.wait_for(lambda: self._ended, timeout)

    def text(self) -> str:
        with self._lock:
            return self._buf.decode("utf-8", errors="replace")


def _drain(stream: Any, tail: _Tail) -> None:
    try:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            tail.feed(chunk)
    except (OSError, ValueError):
        pass


def _worker_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
    env["PYTHONUNBUFFERED"] = "1"  # the tail must hold what printed before a kill
    env.update(parent_watch.child_env())  # the worker dies with us, whatever kills us
    return env


@functools.lru_cache(maxsize=1)
def _fault_dir() -> str:
    from fuselens.private_dirs import scratch_dir

    return scratch_dir("faults")


class _Worker:
    """One worker process and its pipes. Runs are sequential."""

    def __init__(self, cwd: Optional[str], env: dict[str, str], output_limit: int) -> None:
        ev_r, ev_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "fuselens.capture.worker",
            "--events-fd",
            str(ev_w),
            "--control-fd",
            str(ctl_r),
        ]
        # the worker's stack dump (hang, crash): in our private scratch folder, not /tmp
        fd, self.fault_file = tempfile.mkstemp(prefix="fuselens-stack-", suffix=".txt", dir=_fault_dir())
        os.close(fd)
        env = {**env, faultstack.ENV: self.fault_file}
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(ev_w, ctl_r),
                cwd=cwd or None,
                env=_worker_env(env),
                start_new_session=True,  # own process group: kill takes its children too
            )
        finally:
            os.close(ev_w)
            os.close(ctl_r)
        self._events_fd = ev_r
        self._control = os.fdopen(ctl_w, "w", encoding="utf-8")
        self.stdout = _Tail(output_limit)
        self.stderr = _Tail(output_limit)
        self._threads = [
            threading.Thread(target=_drain, args=(self.proc.stdout, self.stdout), daemon=True),
            threading.Thread(target=_drain, args=(self.proc.stderr, self.stderr), daemon=True),
        ]
        for t in self._threads:
            t.start()
        self._buffer = bytearray()
        self.cancelled = False
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (idempotent, any thread)."""
        with self._lock:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    try:
                        self.proc.kill()
                    except ProcessLookupError:
                        pass

    def close(self) -> None:
        """Ask the worker to exit (EOF on control), then make sure it did."""
        try:
            self._control.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self._finish()

    def _finish(self) -> None:
        for t in self._threads:
            t.join(timeout=2)
        try:
            os.unlink(self.fault_file)
        except OSError:
            pass
        try:
            os.close(self._events_fd)
        except OSError:
            pass
        self._events_fd = -1

    def run(self, target: Target, options: RunOptions, on_event: Optional[EventCallback]) -> Report:
        """Run the target once in this worker and return its Report."""
        run_info = RunInfo(
            target=target.label(),
            target_kind=target.kind,
            args=list(target.args),
            backend=options.backend or "",
        )
        builder = ReportBuilder(run_info)
        self.stdout.reset(options.output_limit_bytes)
        self.stderr.reset(options.output_limit_bytes)

        def deliver(event: Any) -> None:
            builder.add(event)
            if on_event is not None:
                try:
                    on_event(event)
                except Exception:  # a broken callback must not lose the report
                    pass

        started_at = time.monotonic()
        # The timeout is the program's: it starts at `__started__`, after the
        # worker imported torch. Until then a generous startup bound applies.
        deadline = started_at + options.timeout_s + _STARTUP_S if options.timeout_s else None
        state = {"started": False, "done": False, "malformed": 0, "timeout_s": options.timeout_s, "deadline": deadline}
        try:
            self._control.write(run_request(to_data(target), to_data(options)))
            self._control.flush()
        except (OSError, ValueError):
            pass  # worker already gone: the read loop sees EOF and reports it
        outcome = self._read_until_done(deadline, deliver, builder, state)
        builder.wall_s = builder.wall_s or round(time.monotonic() - started_at, 6)
        if outcome != "done":
            self._report_death(outcome, options, deliver, state)
        if state["malformed"]:
            deliver(
                ErrorEntry(
                    "internal",
                    f"{state['malformed']} malformed line(s) from the worker were ignored",
                )
            )
        if outcome == "done":  # the program's last output may still be in the pipes
            self.stdout.wait_end(_OUTPUT_END_WAIT_S)
            self.stderr.wait_end(_OUTPUT_END_WAIT_S)
        report = builder.build()
        report.run.stdout_tail = self.stdout.text()
        report.run.stderr_tail = self.stderr.text()
        return report

    def _read_until_done(self, deadline, deliver, builder, state) -> str:
        """Read event lines until `__done__` ("done"), EOF ("eof"), the
        deadline ("timeout") or a cancel ("cancelled")."""
        fd = self._events_fd
        while True:
            if self.cancelled:
                return "cancelled"
            wait = _POLL_S
            deadline = state["deadline"]
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                wait = min(wait, left)
            try:
                ready, _, _ = select.select([fd], [], [], wait)
            except (OSError, ValueError):
                return "eof"
            if not ready:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                return "eof"
            if not chunk:
                return "eof"
            self._buffer += chunk
            while True:
                nl = self._buffer.find(b"\n")
                if nl < 0:
                    if len(self._buffer) > _MAX_LINE:
                        self._buffer.clear()
                        state["malformed"] += 1
                    break
                line = bytes(self._buffer[:nl])
                del self._buffer[: nl + 1]
                if self._handle_line(line, deliver, builder, state):
                    return "done"

    def _drain_events(self, deliver, state) -> None:
        """After the worker died: keep the events it wrote before dying."""
        fd = self._events_fd
        while fd >= 0:
            try:
                ready, _, _ = select.select([fd], [], [], 0.5)
                chunk = os.read(fd, 1 << 16) if ready else b""
            except OSError:
                break
            if not chunk:
                break
            self._buffer += chunk
        lines = bytes(self._buffer).split(b"\n")
        self._buffer.clear()
        for line in lines[:-1]:  # the last piece is an unterminated line
            self._handle_line(line, deliver, None, state)

    def _handle_line(self, line: bytes, deliver, builder, state) -> bool:
        """Returns True on the `__done__` line."""
        if not line.strip():
            return False
        try:
            msg = json.loads(line)
            kind = msg.get("type", "") if isinstance(msg, dict) else ""
        except ValueError:
            state["malformed"] += 1
            return False
        if kind == STARTED:
            state["started"] = True
            if state.get("timeout_s"):
                state["deadline"] = time.monotonic() + state["timeout_s"]
            return False
        if kind == DONE:
            if builder is None:
                return True
            builder.wall_s = float((msg.get("data") or {}).get("wall_s") or 0.0)
            return True
        if kind.startswith("__"):
            return False
        try:
            event = decode_event(line.decode("utf-8", errors="replace"))
        except (ValueError, TypeError, KeyError, AttributeError):
            state["malformed"] += 1
            return False
        deliver(event)
        return False

    def _report_death(self, outcome: str, options: RunOptions, deliver, state) -> None:
        """The run did not finish normally: kill what is left, say why."""
        if outcome == "timeout" and faultstack.DUMP_SIGNAL is not None and self.alive():
            try:  # where was it stuck? faulthandler writes the stacks
                os.kill(self.proc.pid, faultstack.DUMP_SIGNAL)
                time.sleep(0.5)
            except OSError:
                pass
        if outcome in ("timeout", "cancelled"):
            self.kill()
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        self._drain_events(deliver, state)
        where = faultstack.read_location(self.fault_file)  # before _finish removes the file
        self._finish()
        if outcome == "timeout":
            error = ErrorEntry("timeout", f"killed after the {options.timeout_s:g} s timeout")
        elif outcome == "cancelled":
            error = ErrorEntry("killed", "cancelled by the caller; the worker was killed")
        elif code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            error = ErrorEntry("killed", f"the program was killed by {name}")
        elif state["started"]:
            # os._exit() inside the program: the worker had no chance to report.
            error = ErrorEntry("exit", f"the program exited abruptly with code {code}") if code else None
        else:
            tail = self.stderr.text().strip().splitlines()[-5:]
            error = ErrorEntry(
                "internal",
                f"the fuselens worker failed to start (exit code {code})",
                traceback="\n".join(tail),
            )
        if error is not None and error.kind in ("timeout", "killed") and outcome != "cancelled":
            error.location = where
            if error.location is not None:
                stuck = "was running" if outcome == "timeout" else "crashed at"
                error.message += f"; it {stuck} {os.path.basename(error.location.file)}:{error.location.line}"
        if error is not None:
            deliver(error)
        deliver(RunInfo(target="", exit_code=code))


# ---- a spare worker, started ahead of the run ----------------------------------
# A worker's start (Python, torch, the capture hooks) costs seconds that a save
# in the editor would otherwise wait for. `prestart` starts one that waits on its
# control pipe; the next run with the same environment takes it (its cwd does
# not matter: each run changes to the target's) and a new spare starts once that
# run has ended: started beside the run, its torch import would compete with the
# run (and, taken cold, with the taken worker's own import) for the CPU. Each run
# still gets a fresh process: modules the program imported in an earlier run
# must not stand in for edited ones.
_spares: dict[tuple, _Worker] = {}
_spare_lock = threading.Lock()
_DEFAULT_OUTPUT_LIMIT = 65536


def _env_key(env: dict[str, str]) -> tuple:
    return tuple(sorted((str(k), str(v)) for k, v in (env or {}).items()))


def prestart(cwd: str, env: Optional[dict[str, str]] = None) -> None:
    """Start a spare worker for runs with `env` (no-op when one is up). `cwd`
    must be a trusted folder: Python puts it first on sys.path while the worker
    imports torch and fuselens."""
    key = _env_key(env or {})
    with _spare_lock:
        spare = _spares.get(key)
        if spare is not None and spare.alive():
            return
        _spares[key] = _Worker(cwd, dict(env or {}), _DEFAULT_OUTPUT_LIMIT)


def _take_worker(cwd: Optional[str], env: dict[str, str], output_limit: int) -> tuple[_Worker, bool]:
    """The spare for `env` when one is up, else a new worker; and whether a
    spare was kept for `env` (then the caller starts the next one after its run)."""
    key = _env_key(env)
    with _spare_lock:
        spare = _spares.pop(key, None)
    if spare is None:
        return _Worker(cwd, env, output_limit), False
    if not spare.alive():
        spare._finish()
        return _Worker(cwd, env, output_limit), True
    return spare, True


def spare_ready(env: Optional[dict[str, str]] = None) -> bool:
    """Whether a spare worker for `env` is up and has said it is ready (its
    first line waits, unread, on the events pipe)."""
    with _spare_lock:
        spare = _spares.get(_env_key(env or {}))
        if spare is None or not spare.alive() or spare._events_fd < 0:
            return False
        try:
            return bool(select.select([spare._events_fd], [], [], 0)[0])
        except (OSError, ValueError):
            return False


def stop_spares() -> None:
    """Stop every spare worker (the server's shutdown; also at exit)."""
    with _spare_lock:
        spares = list(_spares.values())
        _spares.clear()
    for spare in spares:
        spare.kill()
        spare.proc.wait()
        spare._finish()


atexit.register(stop_spares)


def analyze(target: Target, options: Optional[RunOptions] = None, on_event: Optional[EventCallback] = None,
            echo: Optional[tuple[Any, Any]] = None) -> Report:
    """Run `target` once in a fresh worker; return the folded Report.

    `on_event(event)` is called (from this thread) for every event as it
    arrives, before the Report is complete. Never raises for anything the
    user program does: errors, exits, timeouts and kills become
    `Report.errors` entries. `echo=(out, err)` passes the program's stdout
    and stderr through to these text streams as it runs."""
    options = options or RunOptions()
    worker = _Worker(target.cwd, options.env, options.output_limit_bytes)
    if echo is not None:
        worker.stdout.echo, worker.stderr.echo = echo
    try:
        return worker.run(target, options, on_event)
    finally:
        if worker.alive():
            worker.close()
        else:
            worker._finish()


async def _run_in_thread(worker: _Worker, target: Target, options: RunOptions, on_event: Optional[EventCallback]) -> Report:
    loop = asyncio.get_running_loop()
    callback = None
    if on_event is not None:

        def callback(event: Any) -> None:  # deliver on the event loop's thread
            loop.call_soon_threadsafe(on_event, event)

    future = loop.run_in_executor(None, worker.run, target, options, callback)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # Kill now; the reader thread sees EOF and ends by itself.
        worker.cancelled = True
        worker.kill()
        raise


async def analyze_async(
    target: Target, options: Optional[RunOptions] = None, on_event: Optional[EventCallback] = None
) -> Report:
    """`analyze` for asyncio callers (the language server, the TUI).

    Cancelling the awaiting task kills the worker and its process group at
    once. `on_event` is called on the event loop's thread."""
    options = options or RunOptions()
    worker, spared = _take_worker(target.cwd, options.env, options.output_limit_bytes)
    try:
        return await _run_in_thread(worker, target, options, on_event)
    finally:
        if worker.cancelled:
            pass  # the reader thread reaps the process
        elif worker.alive():
            # The report is complete. The worker's exit (torch's teardown: a
            # second or more on a busy machine) is waited for off the caller's
            # path, so an editor shows the results without waiting for it.
            asyncio.get_running_loop().run_in_executor(None, worker.close)
        if spared and target.cwd:
            prestart(target.cwd, options.env)  # the next run's, from this run's (trusted) folder


class WorkerSession:
    """A worker kept alive between runs of one target, so that a TUI toggle
    re-runs the program without restarting Python and re-importing torch.

    Each `run(options)` calls `torch._dynamo.reset()` in the worker and runs
    the program again as `__main__`. A run that times out, is cancelled or
    kills the worker costs the session its process; the next run starts a
    fresh one. Use as a context manager or call `close()`."""

    def __init__(self, target: Target, env: Optional[dict[str, str]] = None) -> None:
        self.target = target
        self.env = dict(env or {})
        self._worker: Optional[_Worker] = None
        self._lock = threading.Lock()

    def _ensure(self, options: RunOptions) -> _Worker:
        if self._worker is None or not self._worker.alive():
            if self._worker is not None:
                self._worker._finish()
            env = dict(self.env)
            env.update(options.env)
            self._worker = _Worker(self.target.cwd, env, options.output_limit_bytes)
        return self._worker

    @property
    def pid(self) -> Optional[int]:
        """The worker's pid, None before the first run or after close()."""
        return self._worker.proc.pid if self._worker is not None and self._worker.alive() else None

    def run(self, options: Optional[RunOptions] = None, on_event: Optional[EventCallback] = None) -> Report:
        """Run the program once more in the kept worker; blocks until done."""
        options = options or RunOptions()
        with self._lock:
            return self._ensure(options).run(self.target, options, on_event)

    async def run_async(self, options: Optional[RunOptions] = None, on_event: Optional[EventCallback] = None) -> Report:
        """`run` for asyncio callers; cancelling kills the worker (the next
        run starts a new one)."""
        options = options or RunOptions()
        worker = self._ensure(options)
        return await _run_in_thread(worker, self.target, options, on_event)

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        if self._worker is not None:
            if self._worker.alive():
                self._worker.close()
            else:
                self._worker._finish()
            self._worker = None

    def __enter__(self) -> "WorkerSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._worker is not None and self._worker.alive():
                self._worker.kill()
        except Exception:
            pass
