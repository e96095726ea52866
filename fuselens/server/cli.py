"""`fuselens server`: the language server over stdio (never a network port)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any, Callable, Optional


def configure(parser: argparse.ArgumentParser) -> None:
    """The options of `fuselens server`."""
    parser.description = "Language server over stdio: graph breaks, recompiles and fusion as diagnostics."
    parser.add_argument("--stdio", action="store_true", help="talk LSP over stdin/stdout (the default and only transport)")
    parser.add_argument("--log-file", help="write the server's log here (default: stderr, warnings only)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")


def main(argv: Optional[list[str]] = None) -> int:
    """`fuselens server ARGV`; returns the exit code."""
    from fuselens.cli import main as fuselens_main

    return fuselens_main(["server", *(sys.argv[1:] if argv is None else argv)])


def run(args: argparse.Namespace, program_args: list[str]) -> int:
    """Serve LSP over stdio until the editor goes away."""
    if program_args:
        from fuselens.cli_parser import UsageError

        raise UsageError(f"the server runs no program; unexpected {' '.join(program_args)}")
    logging.basicConfig(
        filename=args.log_file,
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    from fuselens import private_dirs
    from fuselens.server import commands, features  # noqa: F401 - importing them registers each feature and command

    # A killed server cannot remove its scratch folder: the next one does.
    private_dirs.clean_stale_scratch()
    server = features.server
    exit_cleanly_on_signals(lambda: _clean_up(server))
    try:
        server.start_io()
    finally:
        server.cleanup()
    return 0


def _clean_up(server: Any) -> None:
    """Everything an exit leaves to atexit, which os._exit skips: the spare
    worker, this server's scratch folder and its workers' (stack dumps)."""
    from fuselens import private_dirs

    server.cleanup()
    private_dirs.remove_scratch()


def exit_cleanly_on_signals(cleanup: Callable[[], None], signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """On SIGTERM/SIGHUP (an editor closing, a terminal going away) run
    `cleanup` (the scratch folder, the spare worker) and exit at once.

    Not by raising SystemExit from a Python signal handler: that handler runs
    only when the main thread next runs Python, and an idle server's main
    thread sleeps in the event loop's select until a message comes (when the
    kernel hands the signal to pygls's stdin reader thread, nothing wakes it);
    and even once raised, pygls's exit waits for that reader thread, which
    returns only when the editor closes stdin. So the C-level handler writes
    the signal's number to a wakeup pipe, whichever thread it lands on, and a
    thread of ours that waits on that pipe cleans up and leaves with
    os._exit. Running workers die with us by themselves (parent_watch);
    SIGKILL leaves the scratch folder to the next server's start. Call from
    the main thread."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for sig in signals:
        signal.signal(sig, _noop)  # a Python handler makes CPython install its C handler, which writes the pipe

    def wait_and_exit() -> None:
        while True:
            got = os.read(read_fd, 1)
            if got and got[0] in signals:  # other handled signals (SIGINT) write here too
                break
        try:
            cleanup()
        finally:
            os._exit(128 + got[0])

    threading.Thread(target=wait_and_exit, name="fuselens-exit-on-signal", daemon=True).start()


def _noop(signum: int, frame: Any) -> None:
    pass


if __name__ == "__main__":
    sys.exit(main())
