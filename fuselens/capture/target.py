"""What to run (`Target`) and how (`RunOptions`). Pure data, no torch.

`Target.from_cli` is the one parser of the target part of every command line
(`fuselens report|tui ...`): a script path, `-m package.module`, or a
notebook, each optionally followed by `-- args...` for the program.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

TargetKind = Literal["script", "module", "notebook"]

# Bounded tail of the user's stdout/stderr kept per run (bytes, each stream).
DEFAULT_OUTPUT_LIMIT = 64 * 1024


class TargetError(Exception):
    """A target that cannot be run: missing file, not Python, bad arguments.
    `str(error)` is a one-line message for the user (the CLI exits with 2)."""


@dataclass
class Target:
    """A program to analyse.

    kind:  "script" (value = path to a .py file), "module" (value = dotted
           module name, run like `python -m`), "notebook" (value = .ipynb path).
    value: as above; script and notebook paths are made absolute.
    args:  the program's own arguments (its sys.argv[1:]).
    cwd:   working directory of the program (default: the caller's cwd).
    shown: the target as the user wrote it (`examples/demo.py`); `label()`
           returns it, so reports name the program the way it was given.
    """

    kind: TargetKind
    value: str
    args: list[str] = field(default_factory=list)
    cwd: Optional[str] = None
    shown: str = ""

    @classmethod
    def from_cli(cls, argv: list[str], cwd: Optional[str] = None) -> "Target":
        """Parse `script.py [-- args]`, `-m pkg.mod [-- args]` or `nb.ipynb`.

        Arguments after the target that are not behind `--` are also passed to
        the program (`fuselens report train.py --epochs 1` works as expected
        only when the caller already removed its own options). Raises
        TargetError with a one-line message on anything unusable."""
        argv = list(argv)
        base = os.path.abspath(cwd or os.getcwd())
        if not argv:
            raise TargetError("no target: give a script.py, -m package.module or a notebook.ipynb")
        head, rest = argv[0], argv[1:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        if head == "--":
            raise TargetError("no target before '--'")
        if head == "-m" or head.startswith("-m") and len(head) > 2:
            module = head[2:] if head != "-m" else (rest.pop(0) if rest else "")
            if rest and rest[0] == "--":
                rest = rest[1:]
            if not module or not _is_dotted_name(module):
                raise TargetError(f"-m needs a module name like package.module, got {module!r}")
            return cls("module", module, rest, base)
        if head.startswith("-"):
            raise TargetError(f"unknown option {head!r} where a target was expected")
        path = os.path.join(base, os.path.expanduser(head))
        if not os.path.exists(path):
            raise TargetError(f"{head}: no such file")
        if os.path.isdir(path):
            raise TargetError(f"{head}: is a directory, not a Python script or notebook")
        if path.endswith(".ipynb"):
            _check_notebook(path, head)
            return cls("notebook", os.path.abspath(path), rest, base, head)
        if not path.endswith((".py", ".pyw")) and not _looks_like_python(path):
            raise TargetError(f"{head}: not a Python script (.py) or notebook (.ipynb)")
        return cls("script", os.path.abspath(path), rest, base, head)

    def label(self) -> str:
        """How the user wrote it: `-m pkg.mod` or the path as given."""
        if self.kind == "module":
            return f"-m {self.value}"
        return self.shown or self.value


@dataclass
class RunOptions:
    """How to run a target.

    backend:          force this backend on every torch.compile ("fuselens",
                      "inductor", "eager", ...); None keeps the program's own.
    timeout_s:        kill the program after this many seconds (ErrorEntry
                      kind "timeout"); None = no limit.
    max_calls:        stop the program once every compiled function that was
                      called ran this many times (see docs/events.md).
    compiler_options: fuselens compiler options (CompilerOptions fields), given
                      to the "fuselens" backend with each of its compiles.
    inductor_config:  torch._inductor.config overrides, {"name": value}.
    time_kernels:     profile compiled calls to fill Kernel.calls/total_time_us.
    output_limit_bytes: tail kept of the program's stdout and of its stderr.
    env:              extra environment variables for the program.
    extra:            free-form, forwarded to the worker untouched.
    cold_caches:      turn Inductor's and fuselens' compile caches off for the
                      run (every graph is compiled and logged afresh); by
                      default they are left as the user has them.
    """

    backend: Optional[str] = None
    timeout_s: Optional[float] = None
    max_calls: Optional[int] = None
    compiler_options: Optional[dict[str, Any]] = None
    inductor_config: dict[str, Any] = field(default_factory=dict)
    time_kernels: bool = False
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT
    env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    cold_caches: bool = False


def _is_dotted_name(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _looks_like_python(path: str) -> bool:
    """An extension-less script with a python shebang is accepted."""
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _check_notebook(path: str, shown: str) -> None:
    import json

    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
    except (OSError, ValueError) as exc:
        raise TargetError(f"{shown}: not a readable notebook ({type(exc).__name__})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise TargetError(f"{shown}: not a notebook (no 'cells' list)")
