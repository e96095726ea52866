"""`fuselens tui TARGET [-- ARGS]`: the interactive profiler.

    fuselens tui train.py -- --epochs 1       profile a script live
    fuselens tui -m pkg.train --backend fuselens
    fuselens tui model.py --backend fuselens -- --lr 3   our options anywhere before --
    fuselens tui --replay before.json after.json   browse recorded reports
    fuselens tui --nproc-per-node 2 train.py -- --epochs 1    every torchrun rank
    fuselens tui -- torchrun --nproc-per-node 2 train.py      any torchrun command line

Never imports torch: the program runs in the capture worker.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from fuselens.compiler import options as compiler_options
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
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a fuselens compiler option (e.g. fusion=off, max_fusion_size=8) or, scoped, "
                   "one of Inductor's toggles (inductor:max_fusion_size=8); repeatable")
    p.add_argument("--no-sample", action="store_true", help="do not sample the worker with py-spy")
    p.add_argument("--export-dir", default=".", help="where `e` writes report files (default: .)")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="run the target with torchrun on N ranks of this host, every rank captured")
    p.add_argument("--run-dir", default=None, metavar="DIR",
                   help="torchrun: where each run's ranks write their events (DIR/run-NNN; default: temporary)")
    p.add_argument("--replay", nargs="+", metavar="REPORT.json",
                   help="show recorded report JSON files (oldest first) instead of running a target")
    return p


_TAKES_VALUE = {"--backend", "--timeout", "--max-calls", "--set", "--export-dir", "--nproc-per-node", "--run-dir"}


class UsageError(ValueError):
    """A command line we will not guess at."""


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our options, the target for Target.from_cli). Everything before `--`
    is ours wherever it stands, before or after the target, and an option we
    do not know is an error for argparse to report, never silently the
    program's: `fuselens tui model.py --backend fuselens` forces the backend.
    The program's own arguments go after `--`."""
    if "--replay" in argv:
        return argv, []  # recorded reports only: argparse takes them all
    before, program = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    known = {opt for action in _parser()._actions for opt in action.option_strings}
    ours: list[str] = []
    target: list[str] = []
    i = 0
    while i < len(before):
        arg = before[i]
        if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
            if target:
                raise UsageError(f"a second target {arg!r} after {' '.join(target)!r}")
            target = before[i:i + 2] if arg == "-m" else [arg]
            i += len(target)
        elif arg.startswith("-"):
            if arg.split("=", 1)[0] not in known:
                raise UsageError(f"unknown option {arg!r}; the program's own arguments go after --")
            width = 2 if arg in _TAKES_VALUE else 1
            ours += before[i:i + width]
            i += width
        elif target:
            raise UsageError(f"unexpected argument {arg!r} after the target {' '.join(target)!r}; "
                             "the program's own arguments go after --")
        else:
            target = [arg]
            i += 1
    return ours, target + (["--", *program] if program else [])


def parse_value(text: str):
    """`on`/`off`/`auto`/numbers/strings as typed on the command line
    (Inductor's switches; the fuselens compiler's are parsed by its options)."""
    low = text.lower()
    if low in ("on", "true", "yes"):
        return True
    if low in ("off", "false", "no"):
        return False
    try:
        return int(text)
    except ValueError:
        return text


def apply_sets(state: ToggleState, sets: list[str]) -> dict:
    """Apply `--set` items; returns the fuselens compiler options that are not
    toggles (e.g. cxx=clang++), for the runs' RunOptions. Raises ValueError
    with a message.

    `NAME=VALUE` or `fuselens:NAME=VALUE` is a fuselens compiler option, read
    like `fuselens report --set` (any valid value, also one the toggle does
    not cycle through); `inductor:NAME=VALUE` is one of Inductor's toggles."""
    extra: dict = {}
    for item in sets:
        key, sep, value = item.partition("=")
        scope, colon, name = key.rpartition(":")
        if not colon or scope == "fuselens":
            name, parsed = compiler_options.parse_assignment(f"{name}{sep}{value}")
            if f"fuselens:{name}" in TOGGLES_BY_KEY:
                state.set(f"fuselens:{name}", parsed, any_value=True)
            else:
                extra[name] = parsed
            continue
        if not sep or key not in TOGGLES_BY_KEY or scope == "run":
            valid = ", ".join(k for k in TOGGLES_BY_KEY if k.startswith("inductor:"))
            raise ValueError(f"--set {item!r}: expected NAME=VALUE (a fuselens compiler option) "
                             f"or SCOPE:NAME=VALUE with SCOPE:NAME one of {valid}")
        toggle = TOGGLES_BY_KEY[key]
        parsed = parse_value(value)
        if value.lower() == "auto" and toggle.auto is not None:
            parsed = toggle.auto
        state.set(key, parsed)
    return extra


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of `fuselens tui`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        ours, rest = _split(argv)
    except UsageError as exc:
        print(f"fuselens tui: {exc}", file=sys.stderr)
        return 2
    parser = _parser()
    args = parser.parse_args(ours)
    toggles = ToggleState(backend=args.backend)
    try:
        extra_compiler_options = apply_sets(toggles, args.set)
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

    from fuselens.capture import RunOptions

    options = RunOptions(timeout_s=args.timeout or None, max_calls=args.max_calls, time_kernels=True,
                         compiler_options=extra_compiler_options or None)
    try:
        session, target = session_for(args, rest)
    except UsageError as exc:
        print(f"fuselens tui: {exc}", file=sys.stderr)
        return 2
    distributed = target is None
    app = FuselensApp(target, session=session, options=options, toggles=toggles, export_dir=args.export_dir,
                      sample=not args.no_sample and not distributed,
                      no_sample_reason=NO_SAMPLE_TORCHRUN if distributed else None)
    try:
        app.run()
    finally:
        session.close()
    return 0


NO_SAMPLE_TORCHRUN = "not sampled: a torchrun run has one process per rank and py-spy follows one"


def session_for(args: argparse.Namespace, rest: list[str]):
    """(session, Target) for a single process; (DistributedSession, None)
    for a torchrun launch, read by the same function as `fuselens report`'s."""
    from fuselens.capture import Target, TargetError, WorkerSession
    from fuselens.capture.distributed import DistributedSession, is_torchrun_command, launch_for

    cut = rest.index("--") if "--" in rest else len(rest)
    spec, program = rest[:cut], rest[cut + 1:]
    if args.nproc_per_node is not None or (not spec and is_torchrun_command(program)):
        try:
            return DistributedSession(launch_for(spec, program, args.nproc_per_node, run_dir=args.run_dir)), None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.run_dir:
        raise UsageError("--run-dir is for torchrun runs: give --nproc-per-node N or -- torchrun ...")
    try:
        target = Target.from_cli(rest)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    return WorkerSession(target), target
