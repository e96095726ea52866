"""No worker outlives the TUI: a real `fuselens tui` on a pseudo-terminal,
ended by a signal while the user's program runs, takes the worker running
that program with it (parent_watch: the TUI starts its worker from a thread,
so the watchdog, not the parent-death signal, has to catch this)."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
import time

import pytest

from lsp_workspaces.harness import pid_alive


def _drain(fd: int) -> None:
    """Read the TUI's screen output so that it never blocks on a full pty."""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_worker_dies_shortly_after_the_tui_is_killed(tmp_path, sig):
    pid_file = tmp_path / "worker.pid"
    program = tmp_path / "forever.py"
    program.write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    time.sleep(0.05)\n"
    )
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="120", LINES="40", FUSELENS_CACHE_DIR=str(tmp_path / "cache"))
    tui = subprocess.Popen(
        [sys.executable, "-m", "fuselens", "tui", "--no-sample", "--timeout", "600", str(program)],
        stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env, start_new_session=True,
    )
    os.close(slave)
    threading.Thread(target=_drain, args=(master,), daemon=True).start()
    worker = None
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text(), 120, "the program to start in the worker")
        worker = int(pid_file.read_text())
        assert worker != tui.pid and pid_alive(worker)
        tui.send_signal(sig)
        tui.wait(timeout=30)
        killed_at = time.monotonic()  # from the TUI's exit: its own shutdown is slower on a loaded CI machine
        _wait_for(lambda: not pid_alive(worker), 5, f"worker {worker} to die after the TUI's {sig.name}")
        assert time.monotonic() - killed_at < 2.0
    finally:
        if tui.poll() is None:
            tui.kill()
            tui.wait()
        if worker is not None and pid_alive(worker):  # a failed check must not leave it running
            os.kill(worker, signal.SIGKILL)
        os.close(master)
