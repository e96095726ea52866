"""A second real client: Neovim's built-in LSP client (headless) gets the
fuselens diagnostics for an example and applies the preferred quick-fix."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
NVIM = shutil.which("nvim")


@pytest.mark.skipif(NVIM is None, reason="Neovim (nvim) is not installed: apt-get install neovim to run this client check")
def test_neovim_shows_recompile_diagnostic_and_applies_mark_dynamic_quickfix(tmp_path):
    program = tmp_path / "recompile.py"
    shutil.copy(HERE / "lsp_workspaces" / "basic" / "recompile.py", program)
    fixed, out = tmp_path / "fixed.py", tmp_path / "summary.json"
    env = dict(os.environ, FL_FILE=str(program), FL_FIXED=str(fixed), FL_OUT=str(out), FL_PYTHON=sys.executable)
    proc = subprocess.run(
        [NVIM, "--headless", "--clean", "-u", "NONE", "-c", f"luafile {HERE / 'nvim' / 'check.lua'}"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(out.read_text())
    (diag,) = summary["diagnostics"]
    assert (diag["code"], diag["source"], diag["line"]) == ("recompile", "fuselens", 3)
    assert "mark_dynamic" in summary["applied"]
    text = fixed.read_text()
    ast.parse(text)
    assert "    torch._dynamo.mark_dynamic(batch, 0)\n    scale(batch)" in text
