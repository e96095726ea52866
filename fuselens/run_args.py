"""The command-line options of every command that runs a program
(`fuselens report`, `fuselens tui`): the target and how it runs, defined
once so that both commands read them alike.

    TARGET | -m MODULE            what to run (the program's arguments go after --)
    --backend, --set NAME=VALUE   the torch.compile backend and fuselens compiler options
    --timeout, --max-calls        when to stop the program
    --nproc-per-node, --run-dir   a torchrun job, every rank captured

Torch-free: the program runs in the capture worker.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Optional

from fuselens.cli_parser import UsageError

FUSELENS_SCOPE = "fuselens"


@dataclass(frozen=True)
class Setting:
    """One `--set`: `NAME=VALUE` or `fuselens:NAME=VALUE` is a fuselens
    compiler option, its value already parsed and checked by the compiler's
    options; `SCOPE:NAME=VALUE` (e.g. `inductor:max_autotune=on`) is a switch
    of another scope, its value the text as typed (only the TUI has those)."""

    scope: str
    name: str
    value: Any
    text: str

    @property
    def key(self) -> str:
        return f"{self.scope}:{self.name}"


def add_run_options(parser: argparse.ArgumentParser, *, default_timeout_s: Optional[float] = None) -> None:
    """Add the target and the run options to `parser`. `default_timeout_s`:
    a limit every run gets unless `--timeout` says otherwise (then 0 means
    none); without it, runs are unlimited and `--timeout` must be positive."""
    parser.add_argument("target", nargs="?", help="script.py or notebook.ipynb")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    group = parser.add_argument_group("run options (the same for fuselens report and fuselens tui)")
    group.add_argument("--backend", metavar="NAME",
                       help="force this torch.compile backend on every compile (fuselens, inductor, eager, ...); "
                            "default: the program's own")
    group.add_argument("--set", dest="settings", action="append", type=parse_setting, default=[],
                       metavar="NAME=VALUE",
                       help="a fuselens compiler option for the run, e.g. --set fusion=off --set max_fusion_size=8 "
                            "(any field of fuselens.compiler.CompilerOptions; the TUI also takes Inductor's "
                            "toggles, inductor:NAME=VALUE); repeatable")
    if default_timeout_s is None:
        group.add_argument("--timeout", type=_positive_float, metavar="S", help="stop the program after S seconds")
    else:
        group.add_argument("--timeout", type=_seconds, default=default_timeout_s, metavar="S",
                           help=f"kill a run after S seconds and show it as an error "
                                f"(default {default_timeout_s:g}; 0: never)")
    group.add_argument("--max-calls", type=_positive_int, metavar="N",
                       help="stop once each compiled function ran N times (training loops need not finish)")
    group.add_argument("--nproc-per-node", type=int, metavar="N",
                       help="run TARGET with torchrun on N ranks of this host, every rank captured")
    group.add_argument("--run-dir", metavar="DIR",
                       help="torchrun: where each rank writes its events (default: a new temporary directory); "
                            "on several hosts, a directory they share")


def target_spec(args: argparse.Namespace) -> list[str]:
    """The target as `Target.from_cli` and `launch_for` read it: `[path]`,
    `["-m", module]`, or `[]` when none was given."""
    if args.module and args.target:
        raise UsageError(f"give either a target or -m MODULE, not both ({args.target!r} and -m {args.module})")
    if args.module:
        return ["-m", args.module]
    return [args.target] if args.target else []


def compiler_options(settings: list[Setting]) -> dict[str, Any]:
    """The fuselens compiler options of `--set`; a switch of another scope is
    a usage error (only the TUI has toggles for Inductor)."""
    for item in settings:
        if item.scope != FUSELENS_SCOPE:
            raise UsageError(f"--set {item.text!r}: expected NAME=VALUE, a fuselens compiler option "
                             f"({item.scope}: switches are the TUI's)")
    return {item.name: item.value for item in settings}


def run_options(args: argparse.Namespace, compiler: dict[str, Any], **more: Any) -> Any:
    """The RunOptions these options ask for, with `compiler` as its fuselens
    compiler options and `more` for the command's own fields."""
    from fuselens.capture import RunOptions

    return RunOptions(backend=args.backend, timeout_s=args.timeout or None, max_calls=args.max_calls,
                      compiler_options=compiler or None, **more)


def parse_setting(text: str) -> Setting:
    """argparse type of `--set`: a fuselens compiler option is checked here,
    so that a bad one stops the command before anything runs."""
    from fuselens.compiler import options  # torch-free

    key, sep, value = text.partition("=")
    scope, colon, name = key.rpartition(":")
    if colon and scope != FUSELENS_SCOPE:
        return Setting(scope, name, value, text)
    try:
        name, parsed = options.parse_assignment(f"{name}{sep}{value}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return Setting(FUSELENS_SCOPE, name, parsed, text)


def _positive_float(text: str) -> float:
    value = _number(text, float, "seconds")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _seconds(text: str) -> float:
    value = _number(text, float, "seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = _number(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _number(text: str, kind: Callable[[str], Any], what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
