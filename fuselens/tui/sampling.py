"""Host-side sampling of the worker with py-spy: where Python spends time.

py-spy has no Python API; we run `py-spy record --format speedscope` against
the worker's pid for the length of one profile and parse the JSON it writes
(a shared frame list; each sample is a stack of frame indices, outermost
first). Attaching works as root or with ptrace rights; when it does not, the
panel says why instead of showing numbers.

Every frame is put in a category so a user sees at a glance whether time
goes to compiling, to the Python wrapper around kernels, or to their code.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from fuselens import present, private_dirs

# Path fragments -> category, first match wins. Order matters: the guard and
# eval-frame code of Dynamo runs on every call (wrapper), the rest of Dynamo
# only while compiling.
_CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("/torchinductor_", "wrapper"),  # Inductor's generated wrapper modules
    ("torch/_dynamo/eval_frame.py", "wrapper"),
    ("torch/_dynamo/guards.py", "wrapper"),
    ("torch/_inductor/runtime/", "wrapper"),
    ("torch/_inductor/output_code.py", "wrapper"),
    ("torch/_functorch/_aot_autograd/runtime_wrappers.py", "wrapper"),
    ("torch/_functorch/_aot_autograd/utils.py", "wrapper"),
    ("fuselens/compiler/runtime", "wrapper"),
    ("torch/_dynamo/", "compile"),
    ("torch/_inductor/", "compile"),
    ("torch/_functorch/", "compile"),
    ("torch/fx/", "compile"),
    ("torch/_subclasses/", "compile"),
    ("torch/_prims", "compile"),
    ("torch/_decomp/", "compile"),
    ("torch/_refs/", "compile"),
    ("sympy/", "compile"),
    ("fuselens/compiler/", "compile"),
    ("triton/", "compile"),
    ("fuselens/capture/", "fuselens"),
    ("importlib", "import"),
    ("<frozen ", "import"),
    ("torch/", "torch"),
)


def categorize(file: str, user_roots: tuple[str, ...] = ()) -> str:
    """The category of a frame by its file path. `user_roots` are the
    directories (or files) of the user's program; they win unless the file
    is inside an installed package."""
    path = file.replace("\\", "/")
    in_packages = "site-packages/" in path or "dist-packages/" in path
    if not in_packages and any(path.startswith(root) for root in user_roots):
        return "user"
    for fragment, category in _CATEGORY_RULES:
        if fragment in path:
            return category
    return "other"


@dataclass(frozen=True)
class FunctionStat:
    """Time in one Python function over a profile, in seconds."""

    function: str
    file: str
    line: int
    self_s: float  # the function was the innermost frame
    total_s: float  # the function was anywhere on the stack
    category: str

    def label(self) -> str:
        return f"{self.function} ({present.short_location(self.file, self.line)})"


@dataclass
class HostProfile:
    """The result of one sampling: top functions and time per category."""

    functions: list[FunctionStat] = field(default_factory=list)
    categories: dict[str, float] = field(default_factory=dict)  # self time per category
    samples: int = 0
    seconds: float = 0.0
    error: str = ""  # why there is no profile, for the panel


def parse_speedscope(data: dict[str, Any], user_roots: tuple[str, ...] = (), top: int = 25) -> HostProfile:
    """Fold a py-spy speedscope document into per-function self/total time.

    Functions are keyed by (name, file) so that different lines of the same
    function add up; the line shown is the function's first sampled line.
    Recursive frames count once per sample toward total time."""
    frames = data.get("shared", {}).get("frames", [])
    keys: list[tuple[str, str]] = []
    first_line: dict[tuple[str, str], int] = {}
    for frame in frames:
        key = (str(frame.get("name", "?")), str(frame.get("file", "?")))
        keys.append(key)
        line = int(frame.get("line") or 0)
        known = first_line.get(key, 0)
        first_line[key] = min(known, line) if known and line else (known or line)
    self_s: dict[tuple[str, str], float] = {}
    total_s: dict[tuple[str, str], float] = {}
    profile = HostProfile()
    for prof in data.get("profiles", []):
        samples = prof.get("samples", [])
        weights = prof.get("weights") or [1.0] * len(samples)
        for stack, weight in zip(samples, weights):
            if not stack:
                continue
            profile.samples += 1
            profile.seconds += weight
            leaf = keys[stack[-1]]
            self_s[leaf] = self_s.get(leaf, 0.0) + weight
            for key in {keys[i] for i in stack}:
                total_s[key] = total_s.get(key, 0.0) + weight
    stats = [
        FunctionStat(name, file, first_line.get((name, file), 0), self_s.get((name, file), 0.0), t,
                     categorize(file, user_roots))
        for (name, file), t in total_s.items()
    ]
    for stat in stats:
        profile.categories[stat.category] = profile.categories.get(stat.category, 0.0) + stat.self_s
    stats.sort(key=lambda s: (-s.self_s, -s.total_s, s.function))
    profile.functions = [s for s in stats if s.self_s > 0][:top]
    return profile


def py_spy_path() -> Optional[str]:
    """py-spy next to this Python (a venv) or on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(local, os.X_OK):
        return local
    return shutil.which("py-spy")


class Sampler:
    """`py-spy record` attached to one process until `stop()`.

    Blocking calls (start waits a moment to see the attach succeed, stop
    waits for py-spy to write its file): call them from a thread."""

    def __init__(self, rate: int = 100, user_roots: tuple[str, ...] = ()) -> None:
        self.rate = rate
        self.user_roots = user_roots
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._dir: Optional[str] = None
        self._error = ""

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, pid: int) -> None:
        """Attach to `pid` (and its subprocesses). Never raises: a failure is
        kept and reported by `stop()`."""
        self._error = ""
        exe = py_spy_path()
        if exe is None:
            self._error = "py-spy is not installed (pip install py-spy)"
            return
        self._dir = private_dirs.scratch_dir("pyspy")  # 0700 in the user's cache, removed at exit
        out = os.path.join(self._dir, "profile.json")
        cmd = [exe, "record", "--pid", str(pid), "--format", "speedscope", "-o", out,
               "--rate", str(self.rate), "--nonblocking", "--subprocesses"]
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE)
        except OSError as exc:
            self._error = f"could not start py-spy: {exc}"

    def stop(self) -> HostProfile:
        """Stop sampling (SIGINT makes py-spy write its file) and parse it."""
        proc, self._proc = self._proc, None
        try:
            if proc is None:
                return HostProfile(error=self._error or "not sampled")
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            assert self._dir is not None
            out = os.path.join(self._dir, "profile.json")
            if not os.path.exists(out):
                lines = (err or b"").decode("utf-8", "replace").strip().splitlines()
                reason = next((l for l in reversed(lines) if l.strip()), f"exit code {proc.returncode}")
                return HostProfile(error=f"py-spy wrote no profile: {reason.removeprefix('py-spy> ')}")
            try:
                with open(out, encoding="utf-8") as f:
                    return parse_speedscope(json.load(f), self.user_roots)
            except (OSError, ValueError) as exc:
                return HostProfile(error=f"unreadable py-spy profile: {exc}")
        finally:
            if self._dir is not None:
                private_dirs.remove_scratch(self._dir)
                self._dir = None

    def kill(self) -> None:
        """Stop without a result (the app is quitting)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if self._dir is not None:
            private_dirs.remove_scratch(self._dir)
            self._dir = None

