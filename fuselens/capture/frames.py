"""Which frames are the user's, and how to point at them.

A location must name the user's code: never torch internals, never
fuselens itself, never the stdlib or `<frozen runpy>`, never a function that
Dynamo generated (`torch_dynamo_resume_in_f_at_7` is reported as `f`).
Notebook cells (`<nb>.ipynb#cellN`) become (file=nb, cell=N). No torch.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sysconfig
from typing import Iterable, Optional

from fuselens.notebook_program import split_cell_filename
from fuselens.events import SourceLocation

_FUSELENS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESUME_RE = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
# A frame of a traceback as text, `  File "f.py", line 7, in fn`: Dynamo's
# user code tracebacks and guard stacks, and the `stack_trace` of FX nodes.
_TRACEBACK_FRAME_RE = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<fn>.+?)\s*$')


@functools.lru_cache(maxsize=None)
def _own_dirs() -> tuple[str, ...]:
    """torch's directory (found without importing torch in the parent) and fuselens'."""
    dirs = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec and spec.origin:
            dirs.append(os.path.realpath(os.path.dirname(spec.origin)) + os.sep)
    except (ImportError, ValueError):
        pass
    dirs.append(os.path.realpath(_FUSELENS_DIR) + os.sep)
    return tuple(dirs)


@functools.lru_cache(maxsize=None)
def _library_dirs() -> tuple[str, ...]:
    stdlib = (os.path.realpath(path) + os.sep for key in ("stdlib", "platstdlib")
              if (path := sysconfig.get_paths().get(key)))
    return (*stdlib, *_own_dirs())


_INSTALLED_TORCH_RE = re.compile(r"/(?:site|dist)-packages/torch/")


def _real(filename: str) -> str:
    return os.path.realpath(filename) if os.path.isabs(filename) else os.path.abspath(filename)


def is_torch_or_fuselens_file(filename: str) -> bool:
    """A frame of torch or of fuselens itself. By directory, or by an installed torch's
    package path (a trace read elsewhere); never by the text "torch" alone, which a path
    can hold elsewhere (the GPU machine's environment lives in /opt/torch/.venv)."""
    if not filename or filename.startswith("<"):
        return True
    if _INSTALLED_TORCH_RE.search(filename.replace("\\", "/")):
        return True
    return _real(filename).startswith(_own_dirs())


def is_custom_op_backward(filename: str, function: str) -> bool:
    """The frame in which a torch.library op's registered backward runs: the `backward`
    of the autograd.Function that torch/_library/autograd.py generates for the op."""
    return function == "backward" and filename.replace("\\", "/").endswith("_library/autograd.py")


def is_user_file(filename: str) -> bool:
    """True for the user's code (scripts, their packages, notebook cells)."""
    if not filename:
        return False
    if split_cell_filename(filename):
        return True
    if filename.startswith("<"):
        return False
    real = _real(filename)
    if real.startswith(_library_dirs()):
        # A user script under site-packages/torch? No: everything there is torch.
        return False
    if "site-packages" in real or "dist-packages" in real:
        # Installed libraries (transformers, torchvision...) are not the
        # user's code: a finding points at the user's innermost frame.
        return False
    return True


def user_function_name(name: str) -> str:
    """`torch_dynamo_resume_in_f_at_7` (possibly nested) -> `f`."""
    while True:
        m = _RESUME_RE.match(name or "")
        if not m:
            return name
        name = m.group("fn")


def resume_line(name: str) -> Optional[int]:
    """The user line a resume function continues from (7 above), or None."""
    m = _RESUME_RE.match(name or "")
    return int(m.group("line")) if m else None


def is_generated_function(name: str) -> bool:
    return bool(_RESUME_RE.match(name or ""))


def make_location(filename: str, line: int, function: str = "", column: int = 0) -> SourceLocation:
    """A SourceLocation with notebook cells split out and the code text filled."""
    code = ""
    try:
        code = linecache.getline(filename, int(line)).strip()
    except Exception:  # linecache can fail on odd names; the text is optional
        code = ""
    cell = split_cell_filename(filename)
    file = cell[0] if cell else filename
    return SourceLocation(
        file=file,
        line=int(line or 0),
        function=user_function_name(function),
        code=code,
        cell=cell[1] if cell else None,
        column=column,
    )


def innermost_user(frames: Iterable[tuple[str, int, str]]) -> Optional[SourceLocation]:
    """The last user frame of (filename, line, function) triples, outermost
    first; None when no frame is the user's."""
    found = None
    for filename, line, function in frames:
        if is_user_file(filename):
            found = (filename, line, function)
    return make_location(*found) if found else None


def traceback_frame(line: str) -> Optional[tuple[str, int, str]]:
    """(filename, line, function) of one frame line of a traceback, else None."""
    m = _TRACEBACK_FRAME_RE.match(line)
    return (m.group("file"), int(m.group("line")), m.group("fn")) if m else None


def traceback_frames(text: str) -> list[tuple[str, int, str]]:
    """The frames of a traceback's text, outermost first; other lines are skipped."""
    return [frame for frame in map(traceback_frame, text.splitlines()) if frame is not None]


def innermost_user_in(traceback: Optional[str]) -> Optional[SourceLocation]:
    """The innermost user frame of a traceback's text (an FX node's `stack_trace`)."""
    return innermost_user(traceback_frames(str(traceback or "")))


def user_stack(frames: Iterable[tuple[str, int, str]]) -> list[SourceLocation]:
    """Only the user's frames, outermost first."""
    return [make_location(f, l, fn) for f, l, fn in frames if is_user_file(f)]


_DEF_CACHE: dict[str, list[tuple[int, int, int]]] = {}


def enclosing_def_line(filename: str, line: int) -> Optional[int]:
    """The `def` line of the innermost function of `filename` whose body
    holds `line`: the code identity of a Dynamo resume function (which is
    named after its function but is not that code object)."""
    import ast

    if filename not in _DEF_CACHE:
        spans: list[tuple[int, int, int]] = []
        try:
            with open(filename, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    spans.append((node.lineno, node.end_lineno or node.lineno, first))
        except (OSError, SyntaxError, ValueError):
            pass
        _DEF_CACHE[filename] = spans
    inside = [s for s in _DEF_CACHE[filename] if s[0] <= line <= s[1]]
    return max(inside)[0] if inside else None
