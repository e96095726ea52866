"""The worker: `python -m fuselens.capture.worker --events-fd N --control-fd M`.

Imports torch once, installs the trace handler and the torch.compile
patches, then serves run requests from the control pipe (one JSON line per
run; EOF ends the worker). Each run: reset Dynamo, apply options, run the
user program as `__main__`, map how it ended to events, send `__done__`.
Events go to the events pipe only; the user's stdout/stderr stay theirs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import threading
import time
import traceback
from typing import Any, Iterator, Optional

from fuselens import kernel_timing, parent_watch
from fuselens.capture import compilecrash
from fuselens.capture import frames as fr
from fuselens.capture.assemble import nest_phase
from fuselens.capture.protocol import DONE, OUTPUT_END, READY, STARTED, control_line
from fuselens.capture.target import RunOptions, Target
from fuselens.events import ErrorEntry, PhaseTime, RunInfo, encode_event
from fuselens.serialize import from_data

_FLUSH_EVERY_S = 0.5


class Channel:
    """Line-oriented writer to the events pipe, shared by threads."""

    def __init__(self, fd: int) -> None:
        self._file = os.fdopen(fd, "w", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def send_line(self, line: str) -> None:
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (BrokenPipeError, ValueError, OSError):
                os._exit(0)  # the parent is gone: nobody to report to

    def event(self, event: Any) -> None:
        self.send_line(event_line(event))


def event_line(event: Any) -> str:
    """One event as its JSON line; an event that cannot be encoded becomes an
    `internal` error saying so, never a lost line (the worker's pipe and a rank's
    file alike)."""
    try:
        return encode_event(event)
    except (TypeError, ValueError) as exc:
        return encode_event(ErrorEntry("internal", f"could not encode {type(event).__name__}: {exc}"))


class Worker:
    # The end-of-output marker is for the runner's drain threads; a torchrun
    # rank's stdout is the terminal's (capture/rank.py turns it off).
    marks_output_end = True

    def __init__(self, channel: Channel) -> None:
        import torch  # noqa: F401  (imported once, before any run: warm sessions)

        from fuselens import sink
        from fuselens.capture.hooks import Capture
        from fuselens.capture import inductor_fusion
        from fuselens.capture.inductor import InductorKernels
        from fuselens.capture.tracehandler import TraceHandler, install

        self.channel = channel
        self.sink = sink
        self.capture = Capture(self._emit, self._frame_for)
        self.kernels = InductorKernels(self._emit, self.capture)
        self.kernels.fusion_log = self.fusion_log = inductor_fusion.install()
        self.handler = TraceHandler(self._emit, self.kernels.on_record)
        self.handler.on_metrics = self.kernels.on_compile_end
        install(self.handler)
        self.capture.install()
        from fuselens.capture import ddp

        ddp.install(self.capture)  # DDP graph splits reported as buckets, not breaks
        self.capture.on_before_call = self._maybe_flush
        sink.add_listener(self._emit)
        self._last_flush = time.monotonic()

    def _emit(self, event: Any) -> None:
        if isinstance(event, PhaseTime):
            event = nest_phase(event)  # the compiler's own phases lie inside "backend"
        self.channel.event(event)

    def _frame_for(self, compile_id: str) -> Optional[tuple[str, int, str]]:
        return self.handler.frames_by_compile.get(compile_id)

    def _maybe_flush(self) -> None:
        """Flush batched producers (kernel timings) from the main thread at
        compiled-call boundaries, at most every _FLUSH_EVERY_S."""
        now = time.monotonic()
        if now - self._last_flush >= _FLUSH_EVERY_S:
            self._last_flush = now
            self._flush_sink()

    def _flush_sink(self) -> None:
        try:
            self.sink.flush()
        except Exception as exc:
            self._emit(ErrorEntry("internal", f"a fuselens producer failed to flush: {exc!r}"))

    # ---------------------------------------------------------------- a run
    def run(self, target: Target, options: RunOptions) -> RunInfo:
        """Run the program once; the RunInfo sent says how it ended."""
        import torch

        from fuselens.capture.hooks import MaxCallsReached
        from fuselens.capture.program import run_target

        torch._dynamo.reset()
        with contextlib.suppress(Exception):
            torch._dynamo.utils.counters.clear()
        self.handler.reset_run()
        self.capture.reset_run(options.backend, options.max_calls, _run_compiler_options(options, self._emit))
        self.kernels.reset_run(options.time_kernels)
        self.fusion_log.reset_run()
        info = RunInfo(
            target=target.label(),
            target_kind=target.kind,
            args=list(target.args),
            backend=options.backend or "",
            torch_version=torch.__version__,
            python_version=platform.python_version(),
            device=_device(torch),
            exit_code=0,
            caches="cold" if options.cold_caches else "warm",
        )
        started = time.monotonic()
        with _environment(options.env), _inductor_config(options):
            self.channel.send_line(control_line(STARTED))
            try:
                with self.kernels.timing():
                    run_target(target)
            except MaxCallsReached:
                info.max_calls_reached = True
            except SystemExit as exc:
                info.exit_code = self._on_exit(exc)
            except SyntaxError as exc:
                info.exit_code = 1
                self._on_syntax_error(exc)
            except BaseException as exc:  # the program's own failure, whatever it is
                info.exit_code = 1
                self._on_exception(exc)
        wall = time.monotonic() - started
        self._finish_run(info, wall)
        return info

    def _finish_run(self, info: RunInfo, wall: float) -> None:
        self.handler.flush_pending()
        self.kernels.flush()
        self._flush_sink()  # the run's last kernel times (both backends)
        kernel_timing.clear()  # a re-run in this worker collects from its own graphs only
        for note in self.capture.internal_notes:
            self._emit(ErrorEntry("internal", note))
        if self.handler.errors:
            self._emit(ErrorEntry("internal", f"{self.handler.errors} trace record(s) could not be read"))
            self.handler.errors = 0
        if self.fusion_log.errors:
            self._emit(ErrorEntry("internal", f"{self.fusion_log.errors} Inductor fusion message(s) could not be read"))
            self.fusion_log.errors = 0
        info.max_calls_reached = info.max_calls_reached or self.capture.max_calls_reached
        self._emit(info)
        sys.stdout.flush()
        sys.stderr.flush()
        if self.marks_output_end:
            _end_output()
        self.channel.send_line(control_line(DONE, wall_s=round(wall, 6)))

    def _on_exit(self, exc: SystemExit) -> int:
        code = exc.code
        if code is None or code == 0:
            return 0
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            message, code = f"sys.exit({code!r})", 1
        else:
            message = f"sys.exit({code})"
        frames = _tb_frames(exc)
        self._emit(ErrorEntry("exit", message, location=fr.innermost_user(frames), traceback=""))
        return code

    def _on_syntax_error(self, exc: SyntaxError) -> None:
        text = "".join(traceback.format_exception_only(type(exc), exc))
        print(text, file=sys.stderr, end="")
        location = None
        if exc.filename and exc.lineno:
            location = fr.make_location(exc.filename, exc.lineno, column=max((exc.offset or 1) - 1, 0))
        message = f"{type(exc).__name__}: {exc.msg}"
        self._emit(ErrorEntry("syntax", message, location=location, traceback=text))

    def _on_exception(self, exc: BaseException) -> None:
        text = _user_traceback(exc)
        print(text, file=sys.stderr, end="")
        message = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        first = message.splitlines()[0] if message else type(exc).__name__
        explained = ""
        site = compilecrash.compile_site(_chain(exc), message)
        if site:
            first, explained = compilecrash.labelled(first, site)
        self._emit(ErrorEntry("exception", first, location=fr.innermost_user(_tb_frames(exc)), traceback=text,
                              explained=explained))


def _device(torch: Any) -> str:
    try:
        if torch.cuda.is_available():
            return f"cuda ({torch.cuda.get_device_name(0)})"
    except Exception:
        pass
    return "cpu"


def _tb_frames(exc: BaseException) -> list[tuple[str, int, str]]:
    return [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]


def _chain(exc: BaseException) -> list[tuple[list[str], list[tuple[str, int, str]]]]:
    """The exception and its causes: (type names along its MRO, frames)."""
    out, seen = [], set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(([t.__name__ for t in type(e).__mro__], _tb_frames(e)))
        e = e.__cause__  # `raise ... from`: how Dynamo wraps a compile failure
    return out


def _user_traceback(exc: BaseException) -> str:
    """Python's traceback text without the worker's and runpy's frames."""
    te = traceback.TracebackException.from_exception(exc)
    frames = list(te.stack)
    first = next((i for i, f in enumerate(frames) if fr.is_user_file(f.filename)), 0)
    te.stack = traceback.StackSummary.from_list(frames[first:])
    return "".join(te.format())


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _inductor_config(options: RunOptions) -> Iterator[None]:
    """Caches as the user has them unless `cold_caches` (Inductor is silent
    about cached graphs, so a cold run shows every fusion log, at the cost of
    compiling everything again), provenance on (kernel -> node -> user line),
    then the user's overrides."""
    try:
        import torch._inductor.config as cfg
    except ImportError:
        yield
        return
    patch: dict[str, Any] = {}
    if options.cold_caches and hasattr(cfg, "force_disable_caches"):
        patch["force_disable_caches"] = True
    trace_cfg = getattr(cfg, "trace", None)
    if trace_cfg is not None and hasattr(trace_cfg, "provenance_tracking_level"):
        patch["trace.provenance_tracking_level"] = 1  # 2.13
    elif trace_cfg is not None and hasattr(trace_cfg, "provenance_tracking"):
        patch["trace.provenance_tracking"] = True  # older spelling
    if options.time_kernels and hasattr(getattr(cfg, "cpp", None), "enable_kernel_profile"):
        patch["cpp.enable_kernel_profile"] = True  # cpp kernels show up in the profiler
    if options.time_kernels and hasattr(cfg, "profiler_mark_wrapper_call"):
        # One profiler range per graph call: tells apart the kernels of a
        # recompiled graph (same names) and the library calls of each graph.
        patch["profiler_mark_wrapper_call"] = True
    patch.update(options.inductor_config or {})
    with cfg.patch(patch):
        yield


def _run_compiler_options(options: RunOptions, emit: Any) -> dict[str, Any]:
    """This run's fuselens compiler options, validated; the capture hooks hand
    them to the backend with each compile (hooks.Capture). Nothing process-wide
    is changed, but the process default is reset so that a program's own
    `fuselens.compiler.configure()` in a kept worker does not reach the next run."""
    from fuselens.compiler import options as compiler_options  # torch-free

    compiler_options.reset()
    wanted = dict(options.compiler_options or {})
    if options.time_kernels:
        wanted.setdefault("time_kernels", True)
    try:
        return compiler_options.validated(wanted)
    except ValueError as exc:
        emit(ErrorEntry("internal", f"fuselens compiler options not used: {exc}"))
        return {}


def _end_output() -> None:
    """Mark the end of this run's output on stdout and stderr (protocol.OUTPUT_END)."""
    for fd in (1, 2):
        try:
            os.write(fd, OUTPUT_END)
        except OSError:
            pass


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuselens.capture.worker")
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args(argv)
    parent_watch.die_with_parent()  # first: a killed server or TUI must not leave the program running
    from fuselens.capture import faultstack

    faultstack.install_in_worker()  # a hang or a crash names the line it was on
    channel = Channel(args.events_fd)
    control = os.fdopen(args.control_fd, "r", encoding="utf-8")
    worker = Worker(channel)
    channel.send_line(control_line(READY))
    for line in control:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            target = from_data(Target, request["target"])
            options = from_data(RunOptions, request.get("options") or {})
        except (ValueError, KeyError, TypeError) as exc:
            channel.event(ErrorEntry("internal", f"bad run request: {exc!r}"))
            _end_output()
            channel.send_line(control_line(DONE, wall_s=0.0))
            continue
        worker.run(target, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
