"""torchrun with every rank under capture (imports torch).

`python -m fuselens.capture.launch --run-dir DIR [--options JSON] -- TORCHRUN_ARGS`

TORCHRUN_ARGS are what the user would give torchrun (`--nproc-per-node 2
train.py --epochs 1`). They are parsed by torchrun's own parser
(`torch.distributed.run.get_args_parser`), so every torchrun option keeps its
meaning; only the program each rank runs is replaced by
`python -m fuselens.capture.rank`, which runs the user's script under capture.
torchrun then launches, rendezvous, watches and stops the ranks as it always
does: fuselens does not launch ranks its own way.

Exit code: torchrun's (0, or 1 when a rank failed); 2 when the command line
is not something fuselens can run (a message on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from typing import Any, Optional

from fuselens.capture.target import RunOptions, Target, TargetError
from fuselens.serialize import from_data, to_data

RANK_MODULE = "fuselens.capture.rank"


def rewrite(torchrun_argv: list[str], run_dir: str, request_file: str, cwd: Optional[str] = None) -> tuple[Any, Target]:
    """torchrun's parsed arguments with the rank entry in place of the
    user's program, and the user's program as a Target. Raises TargetError."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        args = parser.parse_args(torchrun_argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise TargetError(f"torchrun arguments not understood: {' '.join(torchrun_argv)} ({exc})") from None
    if args.no_python:
        raise TargetError("torchrun --no-python runs a program that is not Python: fuselens captures Python ranks only")
    script_args = list(args.training_script_args)
    if script_args and script_args[0] == "--":
        script_args = script_args[1:]
    spec = ["-m", args.training_script] if args.module else [args.training_script]
    target = Target.from_cli([*spec, "--", *script_args], cwd)
    args.module = True
    args.run_path = False
    args.training_script = RANK_MODULE
    args.training_script_args = ["--run-dir", run_dir, "--request", request_file]
    return args, target


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m fuselens.capture.launch")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--options", default="{}", help="RunOptions as JSON")
    ours = parser.parse_args(argv[:cut])
    torchrun_argv = argv[cut + 1:]
    run_dir = os.path.abspath(ours.run_dir)
    os.makedirs(run_dir, exist_ok=True)
    # One request per launcher: on several hosts sharing DIR, each torchrun
    # agent's ranks read their own host's.
    request_file = os.path.join(run_dir, f"request-{socket.gethostname()}-{os.getpid()}.json")
    try:
        args, target = rewrite(torchrun_argv, run_dir, request_file)
        options = from_data(RunOptions, json.loads(ours.options))
    except (TargetError, ValueError) as exc:
        print(f"fuselens: {exc}", file=sys.stderr)
        return 2
    with open(request_file, "w", encoding="utf-8") as f:
        json.dump({"target": to_data(target), "options": to_data(options)}, f)

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    try:
        run(args)
    except SignalException as exc:  # stopped (the report's --timeout): torchrun stopped its ranks first
        print(f"fuselens: torchrun stopped by {exc.sigval.name}", file=sys.stderr)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        # torchrun already stopped the other ranks; each rank's file says how it ended.
        print(f"fuselens: torchrun: {exc.name} failed ({len(exc.failures)} rank(s))", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
