"""`fuselens tui` in a real terminal (tmux): starts, shows the example's
kernels, applies a toggle that re-profiles, quits cleanly. The work is in
scripts/tui_tmux_check.sh so it can also be run by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "tui_tmux_check.sh"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_tui_in_tmux_shows_kernels_applies_a_toggle_and_quits_cleanly():
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    for step in ("the first profile finished", "the toggle started a re-run", "quit cleanly"):
        assert f"ok: {step}" in result.stdout
