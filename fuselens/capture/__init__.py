"""Capture: run a user program in a worker subprocess and turn what torch
did into schema events (fuselens.events).

Public API (parent side; never imports torch):

    from fuselens.capture import Target, TargetError, RunOptions, analyze, analyze_async, WorkerSession

    Target.from_cli(argv, cwd=None) -> Target     # "script.py -- a b", "-m pkg.mod", "nb.ipynb"
        raises TargetError(one-line message): missing file, not Python, bad arguments
    RunOptions(backend=None, timeout_s=None, max_calls=None, compiler_options=None,
               inductor_config={}, time_kernels=False, output_limit_bytes=65536,
               env={}, extra={})
    analyze(target, options=None, on_event=None) -> Report
    await analyze_async(target, options=None, on_event=None) -> Report   # cancel() kills the worker
    WorkerSession(target, env=None)               # one worker kept alive between runs (the TUI)
        .run(options=None, on_event=None) -> Report
        await .run_async(options=None, on_event=None) -> Report
        .close()                                  # also a context manager
    assemble(events, run=None, wall_s=0.0) -> Report   # fold a list of events
    ReportBuilder(run).add(event) / .build()           # incremental folding

`analyze*` never raise for what the program does: exceptions, sys.exit,
syntax errors, timeouts and kills are `Report.errors` entries (kinds
exception, exit, syntax, timeout, killed). `on_event` sees each event as it
arrives (from the calling thread for `analyze`/`run`, on the event loop for
the async forms).

The worker is `python -m fuselens.capture.worker`; it streams JSON lines
(fuselens.events.encode_event) on a dedicated pipe, separate from the user's
stdout/stderr (whose bounded tails end up in `Report.run`).
"""

from fuselens.capture.assemble import ReportBuilder, assemble
from fuselens.capture.runner import WorkerSession, analyze, analyze_async
from fuselens.capture.target import RunOptions, Target, TargetError

__all__ = [
    "Target",
    "TargetError",
    "RunOptions",
    "analyze",
    "analyze_async",
    "WorkerSession",
    "assemble",
    "ReportBuilder",
]
