"""`fuselens tui TARGET [-- ARGS]`: the interactive profiler.

    fuselens tui train.py -- --epochs 1       profile a script live
    fuselens tui -m pkg.train --backend fuselens
    fuselens tui --replay before.json after.json   browse recorded reports

Never imports torch: the program runs in the capture worker.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from fuselens.tui.toggles import TOGGLES_BY_KEY, ToggleState

DEFAULT_TIMEOUT_S = 300.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fuselens tui",
        description="Interactive profiler: kernel times, fusion decisions, live compiler toggles.",
        epilog="Keys: r re-run, e export, s sort, t toggles, k kernels, p host Python, "
        "x cancel run, enter kernel details, q quit.",
    )
    p.add_argument("--backend", default=None,
                   help="force this torch.compile backend (fuselens, inductor, eager, ...); "
                   "default: the program's own")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"kill a run after S seconds and show it as an error (default {DEFAULT_TIMEOUT_S:g}; 0: never)")
    p.add_argument("--max-calls", type=int, default=None, metavar="N",
                   help="stop the program once each compiled function ran N times")
    p.add_argument("--set", action="append", default=[], metavar="SCOPE:NAME=VALUE",
                   help="start with a toggle set, e.g. fuselens:fusion=off or inductor:max_fusion_size=8")
    p.add_argument("--no-sample", action="store_true", help="do not sample the worker with py-spy")
    p.add_argument("--export-dir", default=".", help="where `e` writes report files (default: .)")
    p.add_argument("--replay", nargs="+", metavar="REPORT.json",
                   help="show recorded report JSON files (oldest first) instead of running a target")
    return p


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Our options come before the target; everything from the target on is
    the target's (Target.from_cli handles `-m` and `--`)."""
    takes_value = {"--backend", "--timeout", "--max-calls", "--set", "--export-dir"}
    ours: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--replay":
            return argv, []
        if arg in takes_value:
            ours += argv[i:i + 2]
            i += 2
            continue
        if arg.startswith("--") and arg != "--" and ("=" in arg or arg in ("--no-sample", "--help")):
            ours.append(arg)
            i += 1
            continue
        if arg in ("-h",):
            ours.append(arg)
            i += 1
            continue
        break
    return ours, argv[i:]


def parse_value(text: str):
    """`on`/`off`/`auto`/numbers/strings as typed on the command line."""
    low = text.lower()
    if low in ("on", "true", "yes"):
        return True
    if low in ("off", "false", "no"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def apply_sets(state: ToggleState, sets: list[str]) -> None:
    """Apply `--set scope:name=value` items; raises ValueError with a message."""
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or key not in TOGGLES_BY_KEY:
            valid = ", ".join(k for k in TOGGLES_BY_KEY if not k.startswith("run:"))
            raise ValueError(f"--set {item!r}: expected SCOPE:NAME=VALUE with SCOPE:NAME one of {valid}")
        toggle = TOGGLES_BY_KEY[key]
        parsed = parse_value(value)
        if value.lower() == "auto" and toggle.auto is not None:
            parsed = toggle.auto
        state.set(key, parsed)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of `fuselens tui`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, rest = _split(argv)
    parser = _parser()
    args = parser.parse_args(ours)
    toggles = ToggleState(backend=args.backend)
    try:
        apply_sets(toggles, args.set)
    except ValueError as exc:
        print(f"fuselens tui: {exc}", file=sys.stderr)
        return 2

    from fuselens.tui.app import FuselensApp

    if args.replay:
        from fuselens.events import Report

        reports = []
        for path in args.replay:
            try:
                with open(path, encoding="utf-8") as f:
                    reports.append(Report.from_json(f.read()))
            except (OSError, ValueError, TypeError) as exc:
                print(f"fuselens tui: {path}: cannot read report: {exc}", file=sys.stderr)
                return 2
        app = FuselensApp(reports=reports, labels=[os.path.basename(p) for p in args.replay],
                          toggles=toggles, export_dir=args.export_dir)
        app.run()
        return 0

    from fuselens.capture import RunOptions, Target, TargetError, WorkerSession

    try:
        target = Target.from_cli(rest)
    except TargetError as exc:
        print(f"fuselens tui: {exc}", file=sys.stderr)
        return 2
    options = RunOptions(timeout_s=args.timeout or None, max_calls=args.max_calls, time_kernels=True)
    session = WorkerSession(target)
    app = FuselensApp(target, session=session, options=options, toggles=toggles,
                      export_dir=args.export_dir, sample=not args.no_sample)
    try:
        app.run()
    finally:
        session.close()
    return 0
