"""The `fuselens` command: subcommands report, server, tui.

Each subcommand lives in its own package and exposes `main(argv) -> int`;
this module only dispatches, so `fuselens server` never imports the report
renderer, and nothing here imports torch.
"""

from __future__ import annotations

import sys
from typing import Optional

USAGE = """usage: fuselens <command> [options]

commands:
  report TARGET [-- ARGS]   run TARGET under capture, print or write a report
  tui TARGET [-- ARGS]      interactive profiler in the terminal
  server                    language server over stdio (for editors)
  version                   print versions

TARGET is a script path, `-m package.module`, or a notebook (.ipynb).
`fuselens <command> --help` for the options of each command."""


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "report":
        from fuselens.report.cli import main as run
    elif command == "server":
        from fuselens.server.cli import main as run
    elif command == "tui":
        from fuselens.tui.cli import main as run
    elif command in ("version", "--version"):
        from fuselens import __version__

        print(f"fuselens {__version__}")
        return 0
    else:
        print(f"fuselens: unknown command {command!r} (try: report, tui, server)", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
