"""Capture: run a user program in a worker subprocess and turn what torch
did into schema events (fuselens.events).

Public API (parent side; never imports torch):

    from fuselens.capture import Target, RunOptions, analyze, analyze_async, WorkerSession

    Target.from_cli(argv)        -> Target        # "script.py a b", "-m pkg.mod", "nb.ipynb"
    analyze(target, options, on_event=None) -> Report
    await analyze_async(target, options, on_event=None) -> Report   # cancel() kills the worker
    WorkerSession(target)        # one worker kept alive between runs (the TUI)
        .run(options) -> Report

The worker is `python -m fuselens.capture.worker`; it streams JSON lines
(fuselens.events.encode_event) on a dedicated pipe, separate from the user's
stdout/stderr.
"""
