"""Run the user's program as `__main__` inside the worker (no torch here).

Scripts and modules go through runpy, as `python script.py` / `python -m`
would; notebooks run their code cells in order in one fresh `__main__`
module, each cell compiled under its `<nb>.ipynb#cellN` name and registered
in linecache so tracebacks and Dynamo show the cell's code.
"""

from __future__ import annotations

import linecache
import os
import runpy
import sys
import types
from typing import Any

from fuselens.capture import frames as fr
from fuselens.capture.notebook import load_cells
from fuselens.capture.target import Target


def run_target(target: Target) -> None:
    """Execute the target; exceptions (SystemExit included) propagate."""
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    saved_modules = set(sys.modules)
    try:
        if target.cwd:
            os.chdir(target.cwd)
        if target.kind == "script":
            sys.argv = [target.value] + list(target.args)
            sys.path[0:1] = [os.path.dirname(target.value)]
            runpy.run_path(target.value, run_name="__main__")
        elif target.kind == "module":
            sys.argv = [target.value] + list(target.args)
            sys.path[0:1] = [os.getcwd()]
            runpy.run_module(target.value, run_name="__main__", alter_sys=True)
        elif target.kind == "notebook":
            sys.argv = [target.value] + list(target.args)
            sys.path[0:1] = [os.path.dirname(target.value)]
            _run_notebook(target.value)
        else:
            raise ValueError(f"unknown target kind {target.kind!r}")
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        try:
            os.chdir(saved_cwd)
        except OSError:
            pass
        _forget_user_modules(saved_modules)


def _run_notebook(path: str) -> None:
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__dict__["__builtins__"] = __builtins__
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        for cell in load_cells(path):
            lines = cell.source.splitlines(keepends=True)
            # mtime None: linecache.checkcache keeps the entry (no file behind it)
            linecache.cache[cell.filename] = (len(cell.source), None, lines, cell.filename)
            code = compile(cell.source, cell.filename, "exec")
            exec(code, module.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _forget_user_modules(before: set[str]) -> None:
    """Drop modules the program imported from the user's files, so that a
    re-run in a kept worker (WorkerSession) sees edited sources."""
    for name in set(sys.modules) - before:
        module: Any = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if file and fr.is_user_file(file) and not any(d in file for d in ("site-packages", "dist-packages")):
            sys.modules.pop(name, None)
