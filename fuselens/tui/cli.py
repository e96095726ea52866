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

from fuselens import run_args
from fuselens.cli_parser import UsageError
from fuselens.tui.toggles import TOGGLES_BY_KEY, ToggleState

DEFAULT_TIMEOUT_S = 300.0


def configure(p: argparse.ArgumentParser) -> None:
    """The options of `fuselens tui`: the shared run options and its own."""
    p.description = "Interactive profiler: kernel times, fusion decisions, live compiler toggles."
    p.epilog = ("Keys: r re-run, e export, s sort, t toggles, k kernels, p host Python, "
                "x cancel run, enter kernel details, q quit.")
    run_args.add_run_options(p, default_timeout_s=DEFAULT_TIMEOUT_S)
    p.add_argument("--no-sample", action="store_true", help="do not sample the worker with py-spy")
    p.add_argument("--export-dir", default=".", help="where `e` writes report files (default: .)")
    p.add_argument("--replay", nargs="+", metavar="REPORT.json",
                   help="show recorded report JSON files (oldest first) instead of running a target")


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


def apply_sets(state: ToggleState, sets: list[run_args.Setting]) -> dict:
    """Apply `--set` items; returns the fuselens compiler options that are not
    toggles (e.g. cxx=clang++), for the runs' RunOptions. Raises ValueError
    with a message.

    A fuselens compiler option (`NAME=VALUE`, `fuselens:NAME=VALUE`) arrives
    parsed and checked like `fuselens report --set`, with any valid value,
    also one the toggle does not cycle through; `inductor:NAME=VALUE` is one
    of Inductor's toggles."""
    extra: dict = {}
    for item in sets:
        if item.scope == run_args.FUSELENS_SCOPE:
            if item.key in TOGGLES_BY_KEY:
                state.set(item.key, item.value, any_value=True)
            else:
                extra[item.name] = item.value
            continue
        if "=" not in item.text or item.key not in TOGGLES_BY_KEY or item.scope == "run":
            valid = ", ".join(k for k in TOGGLES_BY_KEY if k.startswith("inductor:"))
            raise ValueError(f"--set {item.text!r}: expected NAME=VALUE (a fuselens compiler option) "
                             f"or SCOPE:NAME=VALUE with SCOPE:NAME one of {valid}")
        toggle = TOGGLES_BY_KEY[item.key]
        parsed = parse_value(item.value)
        if item.value.lower() == "auto" and toggle.auto is not None:
            parsed = toggle.auto
        state.set(item.key, parsed)
    return extra


def main(argv: Optional[list[str]] = None) -> int:
    """`fuselens tui ARGV`; returns the exit code."""
    from fuselens.cli import main as fuselens_main

    return fuselens_main(["tui", *(sys.argv[1:] if argv is None else argv)])


def run(args: argparse.Namespace, program_args: list[str]) -> int:
    """Start the app on a target, a torchrun job or recorded reports."""
    toggles = ToggleState(backend=args.backend)
    try:
        extra_compiler_options = apply_sets(toggles, args.settings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.replay:
        return _replay(args, toggles)

    from fuselens.tui.app import FuselensApp

    options = run_args.run_options(args, extra_compiler_options, time_kernels=True)
    session, target = session_for(args, program_args)
    distributed = target is None
    app = FuselensApp(target, session=session, options=options, toggles=toggles, export_dir=args.export_dir,
                      sample=not args.no_sample and not distributed,
                      no_sample_reason=NO_SAMPLE_TORCHRUN if distributed else None)
    try:
        app.run()
    finally:
        session.close()
    return 0


def _replay(args: argparse.Namespace, toggles: ToggleState) -> int:
    from fuselens.events import Report
    from fuselens.tui.app import FuselensApp

    reports = []
    for path in args.replay:
        try:
            with open(path, encoding="utf-8") as f:
                reports.append(Report.from_json(f.read()))
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"{path}: cannot read report: {exc}") from None
    app = FuselensApp(reports=reports, labels=[os.path.basename(p) for p in args.replay],
                      toggles=toggles, export_dir=args.export_dir)
    app.run()
    return 0


NO_SAMPLE_TORCHRUN = "not sampled: a torchrun run has one process per rank and py-spy follows one"


def session_for(args: argparse.Namespace, program_args: list[str]):
    """(session, Target) for a single process; (DistributedSession, None)
    for a torchrun launch, read by the same function as `fuselens report`'s."""
    from fuselens.capture import Target, TargetError, WorkerSession
    from fuselens.capture.distributed import DistributedSession, is_torchrun_command, launch_for

    spec = run_args.target_spec(args)
    if args.nproc_per_node is not None or (not spec and is_torchrun_command(program_args)):
        try:
            return DistributedSession(launch_for(spec, program_args, args.nproc_per_node, run_dir=args.run_dir)), None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.run_dir:
        raise UsageError("--run-dir is for torchrun runs: give --nproc-per-node N or -- torchrun ...")
    try:
        # Without a target, program arguments alone are "no target before '--'".
        target = Target.from_cli([*spec, "--", *program_args] if program_args else spec)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    return WorkerSession(target), target
