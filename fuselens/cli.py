"""The `fuselens` command: one argparse tree, subcommands report, tui,
server and version.

Each subcommand module exposes `configure(parser)` (its options; report and
tui share `fuselens.run_args` for the target and how it runs) and
`run(args, program_args) -> int`. Everything after the first `--` is the
program's; before it, every word is ours wherever it stands (`fuselens tui
model.py --backend fuselens` forces the backend) and one we do not know is an
error. Nothing here imports torch, and the renderers load only when used.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from fuselens.cli_parser import Parser, ParserExit, UsageError, refuse_extras, split_program_args

EXIT_USAGE = 2

DESCRIPTION = "Inspect what torch.compile did to a program: graph breaks, recompiles, kernels, fusion."

EPILOG = """TARGET is a script path, `-m package.module`, or a notebook (.ipynb); the program's
own arguments go after --. `fuselens <command> --help` for the options of each command."""


def build_parser() -> Parser:
    """The whole command line of `fuselens`, every subcommand included."""
    from fuselens import __version__
    from fuselens.report import cli as report
    from fuselens.server import cli as server
    from fuselens.tui import cli as tui

    root = Parser(prog="fuselens", usage="fuselens <command> [options]", description=DESCRIPTION, epilog=EPILOG)
    root.add_argument("--version", action="version", version=f"fuselens {__version__}")
    commands = root.add_subparsers(dest="command", title="commands", metavar="<command>")
    for name, module, summary in (
        ("report", report, "TARGET [-- ARGS]  run TARGET under capture, print or write a report"),
        ("tui", tui, "TARGET [-- ARGS]  interactive profiler in the terminal"),
        ("server", server, "language server over stdio (for editors)"),
    ):
        sub = commands.add_parser(name, prog=f"fuselens {name}", help=summary)
        module.configure(sub)
        sub.set_defaults(run=module.run)
    commands.add_parser("version", help="print versions").set_defaults(run=_version)
    return root


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(our options, the program's arguments) of a `fuselens` command line;
    raises UsageError, or ParserExit once `--help` or `--version` printed."""
    ours, program_args = split_program_args(argv)
    args, extras = build_parser().parse_known_args(ours)
    refuse_extras(extras)
    return args, program_args


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of `fuselens`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["help"]:
        argv = ["--help"]
    ours, _ = split_program_args(argv)
    try:
        args, program_args = parse(argv)
        if args.command is None:
            build_parser().print_help()
            return EXIT_USAGE
        return args.run(args, program_args)
    except ParserExit as done:
        return done.status
    except UsageError as exc:
        print(f"{_prog(ours)}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{_prog(ours)}: interrupted", file=sys.stderr)
        return 130


def _prog(ours: list[str]) -> str:
    """`fuselens report` when the error is the report's, else `fuselens`."""
    return f"fuselens {ours[0]}" if ours and ours[0] in ("report", "tui", "server", "version") else "fuselens"


def _version(args: argparse.Namespace, program_args: list[str]) -> int:
    from fuselens import __version__

    print(f"fuselens {__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
