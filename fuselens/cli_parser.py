"""The argparse behaviour every `fuselens` command shares: a bad command line
is one line on stderr and exit code 2, never argparse's usage dump and
SystemExit; and the program's own arguments are what follows `--`.

Torch-free and import-light: `fuselens server` loads it too.
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn, Optional

PROGRAM_ARGS_HINT = "the program's own arguments go after --"


class UsageError(Exception):
    """A one-line message for the user; the command exits with code 2."""


class ParserExit(Exception):
    """argparse finished the command itself (`--help`, `--version`): exit
    with `status` instead of raising SystemExit, so that `main(argv)` returns."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting. Options are
    never abbreviated: `--back` is not `--backend`, it is an unknown option."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def exit(self, status: int = 0, message: Optional[str] = None) -> NoReturn:
        if message:
            raise UsageError(message.strip())
        raise ParserExit(status)


def split_program_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(ours, the program's): everything after the first `--` belongs to the
    program, untouched, whatever it looks like."""
    if "--" not in argv:
        return list(argv), []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def refuse_extras(extras: list[str]) -> None:
    """Words argparse did not take before `--`: an option we do not know is an
    error, never silently the program's; so is a second positional."""
    if not extras:
        return
    first = extras[0]
    if first.startswith("-") and len(first) > 1:
        raise UsageError(f"unknown option {first.split('=', 1)[0]!r}; {PROGRAM_ARGS_HINT}")
    raise UsageError(f"unexpected argument(s) {' '.join(extras)}; {PROGRAM_ARGS_HINT}")
