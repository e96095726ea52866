"""`fuselens server`: the language server over stdio (never a network port)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Optional


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fuselens server",
        description="Language server over stdio: graph breaks, recompiles and fusion as diagnostics.",
    )
    parser.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default and only transport)")
    parser.add_argument("--log-file", help="write the server's log here (default: stderr, warnings only)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        filename=args.log_file,
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    from fuselens.server.features import register
    from fuselens.server.server import FuselensServer

    server = FuselensServer()
    register(server)
    # SIGTERM/SIGHUP (an editor closing, a terminal going away) end the server
    # through the `finally` below, which removes its scratch folder; its workers
    # die with it by themselves (parent_watch). SIGKILL leaves the folder for
    # the next server's start to remove.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    try:
        server.start_io()
    finally:
        server.cleanup()
    return 0


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
