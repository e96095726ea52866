"""The distributed part of `fuselens report`: its options, and running or
merging a torchrun job. Never imports torch (torchrun runs in a subprocess).

  fuselens report --nproc-per-node 2 train.py -- --epochs 1
  fuselens report -- torchrun --nnodes 1 --nproc-per-node 2 train.py
  fuselens report --run-dir /shared/run1 -- torchrun --nnodes 2 ... train.py   (on each host)
  fuselens report --merge /shared/run1
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional

from fuselens import run_args
from fuselens.events import Report

TORCHRUN_HELP_EPILOG = """distributed (torchrun):
  fuselens report --nproc-per-node 2 train.py [-- ARGS]    2 ranks on this host
  fuselens report -- torchrun --nproc-per-node 2 train.py  any torchrun command line
  fuselens report --merge DIR                               render the ranks written to DIR"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The report's own distributed option; --nproc-per-node and --run-dir
    are run options shared with the TUI (fuselens.run_args)."""
    p.add_argument("--merge", metavar="DIR", help="render the ranks a distributed run wrote to DIR, running nothing")


class TorchrunUsage(Exception):
    """Bad distributed usage; the report command turns it into exit code 2."""


def wanted(args: argparse.Namespace, program_args: list[str]) -> bool:
    """Whether this command runs a torchrun job."""
    from fuselens.capture.distributed import is_torchrun_command

    if args.nproc_per_node is not None:
        return True
    return not args.target and not args.module and is_torchrun_command(program_args)


def launch_of(args: argparse.Namespace, program_args: list[str]) -> Any:
    """The TorchrunLaunch the command line asks for."""
    from fuselens.capture.distributed import launch_for

    try:
        return launch_for(run_args.target_spec(args), program_args, args.nproc_per_node, run_dir=args.run_dir,
                          cwd=os.getcwd())
    except ValueError as exc:
        raise TorchrunUsage(str(exc)) from None


def run(args: argparse.Namespace, program_args: list[str], options: Any, echo: Any = None) -> Report:
    """Run the job under capture; the merged report of all ranks. `echo`:
    where the job's (stdout, stderr) pass through as it runs."""
    from fuselens.capture.distributed import analyze_distributed

    return analyze_distributed(launch_of(args, program_args), options, echo=echo)


def merged(path: str) -> Report:
    """The report of a run directory (`--merge DIR`)."""
    from fuselens.capture.rankmerge import merge_run_dir

    if not os.path.isdir(path):
        raise TorchrunUsage(f"--merge {path}: no such directory")
    try:
        return merge_run_dir(path)
    except FileNotFoundError as exc:
        raise TorchrunUsage(str(exc)) from None


def check_merge_usage(args: argparse.Namespace, program_args: list[str]) -> Optional[str]:
    """A one-line complaint when --merge is combined with a run."""
    if args.merge and (args.target or args.module or program_args or args.nproc_per_node or args.from_json):
        return "--merge renders a run directory; give no target, --nproc-per-node or --from-json with it"
    return None
