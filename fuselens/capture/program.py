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
import tokenize
import types
from typing import Any

from fuselens.capture import frames as fr
from fuselens.notebook_program import load_cells
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
            check_source_encoding(target.value)
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


def check_source_encoding(path: str) -> None:
    """Raise the SyntaxError `python script.py` raises for a file that is not
    valid in its declared encoding (UTF-8 without a coding line).

    runpy compiles the file's bytes leniently and would run a latin-1 script
    that CPython refuses; the report must say what `python` would say."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return  # runpy reports a missing or unreadable file itself
    lines = iter(data.splitlines(keepends=True))
    try:
        encoding, _ = tokenize.detect_encoding(lambda: next(lines, b""))
    except SyntaxError as exc:
        if "unknown encoding" in str(exc.msg):  # a coding line naming no codec
            raise SyntaxError(str(exc.msg), (path, 1, 0, None)) from None
        encoding = "utf-8"  # the first lines are not UTF-8 and declare nothing
    try:
        data.decode(encoding)
        return
    except UnicodeDecodeError as exc:
        bad = exc
    line = data.count(b"\n", 0, bad.start) + 1
    if encoding == "utf-8" and not data.startswith(b"\xef\xbb\xbf"):
        # CPython's tokenizer words it this way when no coding line is given.
        message = (
            f"Non-UTF-8 code starting with '\\x{data[bad.start]:02x}' in file {path} on line {line}, "
            "but no encoding declared; see https://peps.python.org/pep-0263/ for details"
        )
    else:
        message = f"(unicode error) {bad}"
    raise SyntaxError(message, (path, line, 0, None))


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
