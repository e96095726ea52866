"""Fix verdicts kept between reports, so that a warm `fuselens report` does not
re-run the program once per candidate fix (issue 18: a warm report takes at
most 1.2x the plain run).

A verdict (did this fix, applied, leave a program that runs without the
finding?) is stored under a key made of everything the re-run depended on
that fuselens can see: the edited program's text, the text of the Python
files next to it that it imports (transitively), the finding the fix
targets, the program's arguments and working directory, the run options,
the TORCH*/PYTORCH*/FUSELENS* environment, and the fuselens, torch and
Python versions. Change any of them and the key changes: the fix is re-run.
What it cannot see (data files the program reads, other environment
variables, installed libraries besides torch) is what `--cold` is for: it
ignores stored verdicts and stores fresh ones.

Verdicts live in `<cache_root>/fix-verdicts/<key>.json`, in a private
(0700, owner-checked) folder; each file is checked to be ours and writable by
nobody else before it is read back (fuselens/private_dirs.py).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import fuselens
from fuselens import private_dirs

FOLDER = "fix-verdicts"
# Environment variables that change what torch.compile does, or that our own
# programs read (examples/demo.py: FUSELENS_DEMO_BACKEND). The rest of the
# environment (PWD, terminal, ssh agent) changes between shells and would
# make every verdict miss.
ENV_PREFIXES = ("TORCH", "PYTORCH", "FUSELENS", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
MAX_LOCAL_FILES = 200  # a huge repository next to a script: hash this many, then stop


@dataclass(frozen=True)
class Verdict:
    """What re-running the program with one fix showed."""

    verified: Optional[bool]  # None: not tried (the edit could not be made in this program)
    note: str


@dataclass(frozen=True)
class RunContext:
    """What a verification run depends on besides the edited program text;
    fixed for one report."""

    script: str  # absolute path of the program
    args: tuple[str, ...] = ()
    cwd: str = ""
    options: str = ""  # the run options that change behaviour, as canonical JSON
    torch_version: str = ""
    python_version: str = ""
    env: tuple[tuple[str, str], ...] = ()
    local_files: str = ""  # digest of the workspace Python files the program imports
    fuselens_version: str = ""  # the version and a digest of fuselens' own source

    @classmethod
    def of(cls, script: str, args: Iterable[str], cwd: str, options: dict[str, Any], torch_version: str,
           python_version: str, environ: Optional[dict[str, str]] = None) -> "RunContext":
        environ = dict(os.environ if environ is None else environ)
        env = tuple(sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIXES)))
        return cls(os.path.abspath(script), tuple(args), os.path.abspath(cwd or "."),
                   json.dumps(options, sort_keys=True, default=str), torch_version, python_version, env,
                   local_files_digest(script), fuselens_identity())


@dataclass
class VerdictStore:
    """Verdicts read from and written to the private cache folder. `refresh`
    (`--cold`): read nothing, write what the runs show. A folder that is not
    private (another account could write it) turns the store off: every fix
    is re-run, nothing is stored."""

    folder: Optional[str]
    refresh: bool = False
    hits: int = 0
    problems: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, refresh: bool = False) -> "VerdictStore":
        try:
            return cls(private_dirs.cache_dir(FOLDER), refresh)
        except (OSError, private_dirs.UnsafePathError) as exc:
            return cls(None, refresh, problems=[str(exc)])

    def get(self, key: str) -> Optional[Verdict]:
        if self.folder is None or self.refresh:
            return None
        path = os.path.join(self.folder, f"{key}.json")
        if not os.path.exists(path):
            return None
        try:
            private_dirs.check_private_file(path)
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            verdict = Verdict(bool(data["verified"]), str(data["note"]))
        except (OSError, ValueError, KeyError, TypeError, private_dirs.UnsafePathError) as exc:
            self.problems.append(f"ignored stored verdict {path}: {exc}")
            return None
        self.hits += 1
        return verdict

    def put(self, key: str, verdict: Verdict) -> None:
        if self.folder is None:
            return
        try:
            # mkstemp: a new 0600 file of ours; replace() makes the write atomic,
            # so a report killed mid-write never leaves half a verdict.
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"verified": verdict.verified, "note": verdict.note}, f)
            os.replace(tmp, os.path.join(self.folder, f"{key}.json"))
        except OSError as exc:
            self.problems.append(f"could not store a verdict: {exc}")


@functools.lru_cache(maxsize=1)
def fuselens_identity() -> str:
    """fuselens' version and a digest of its source (~100 files, ~5 ms): a
    development checkout changes without a version bump, and a change to the
    capture or to the fix catalogue can change a verdict."""
    package = os.path.dirname(os.path.abspath(fuselens.__file__))
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            _hash_file(h, os.path.join(folder, name), package)
    return f"{fuselens.__version__}+{h.hexdigest()[:16]}"


def verdict_key(context: RunContext, edited_source: str, finding: tuple[str, ...]) -> str:
    """The content key of one verification run: `edited_source` (the program
    with the fix applied) run in `context`, checked for `finding`."""
    h = hashlib.sha256()
    for part in (repr(context), edited_source, repr(finding)):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


# -- the workspace files a program imports ------------------------------------------
def local_files_digest(script: str) -> str:
    """A digest of the Python files beside `script` (its folder is sys.path[0])
    that it imports, directly or through each other; a package counts with
    every .py file under it. Unreadable files count by name only."""
    root = os.path.dirname(os.path.abspath(script))
    seen: set[str] = set()
    todo = [os.path.abspath(script)]
    h = hashlib.sha256()
    while todo and len(seen) < MAX_LOCAL_FILES:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError:
            continue
        for name in sorted(_imported_top_names(text)):
            todo += _local_files(root, name)
    for path in sorted(seen):
        if path == os.path.abspath(script):
            continue  # the program's own text is in the key already (edited)
        _hash_file(h, path, root)
    return h.hexdigest()


def _imported_top_names(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _local_files(root: str, name: str) -> list[str]:
    """`name.py` beside the program, or every .py file of the package `name/`."""
    module = os.path.join(root, f"{name}.py")
    if os.path.isfile(module):
        return [module]
    package = os.path.join(root, name)
    if not os.path.isfile(os.path.join(package, "__init__.py")):
        return []
    found = []
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")]
        if len(found) >= MAX_LOCAL_FILES:
            break
    return found[:MAX_LOCAL_FILES]


def _hash_file(h: "hashlib._Hash", path: str, root: str) -> None:
    """Feed a file's path (relative to `root`) and content digest into `h`."""
    h.update(os.path.relpath(path, root).encode("utf-8", "surrogateescape") + b"\0")
    try:
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    except OSError:
        h.update(b"unreadable")
