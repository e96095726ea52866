"""Per-user directories for caches and scratch space, and the one rule that guards
them: nothing is imported, loaded, compiled against or read back from a place
another local account can write.

* `cache_root()`: $FUSELENS_CACHE_DIR, else $XDG_CACHE_HOME/fuselens, else
  ~/.cache/fuselens. Never a shared folder such as /tmp.
* `private_dir(path)`: the directory, created 0700 when missing; an existing one
  must be ours (owner = this process's user); we tighten it to 0700. No ancestor
  may be writable by others unless it is sticky (like /tmp) and owned by root or
  us, or another user could rename our folder away and put theirs in its place.
* `check_private_file(path)`: before a file is imported or loaded: a regular file,
  ours, writable by nobody else, in a private directory.
* `scratch_dir(kind)`: a fresh 0700 folder under `<cache_root>/scratch`, named
  with this process's pid, removed at exit; `clean_stale_scratch()` removes the
  folders of this user's processes that are gone (a SIGKILL leaves them behind).

Any breach raises `UnsafePathError`, whose message names the path and the fix.
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import threading
import uuid
from typing import Optional


class UnsafePathError(PermissionError):
    """A cache or scratch path another user could have written."""


_checked: set[str] = set()  # directories already proven private in this process
_lock = threading.Lock()
_scratch: list[str] = []  # this process's scratch folders, removed at exit


def _uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else -1


def cache_root() -> str:
    """The per-user cache folder of fuselens (not created)."""
    explicit = os.environ.get("FUSELENS_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fuselens")


def cache_dir(*parts: str) -> str:
    """A private folder under the cache root, created when missing."""
    return private_dir(os.path.join(cache_root(), *parts))


def private_dir(path: str) -> str:
    """`path` (absolute, symlinks resolved) as a private directory: created 0700
    when missing, else owned by us (tightened to 0700). Raises UnsafePathError."""
    real = os.path.realpath(os.path.abspath(path))
    if real in _checked:
        return real
    with _lock:
        _check_ancestors(real)
        _make_0700(real)
        st = os.lstat(real)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(f"fuselens: {real} is not a directory; remove it or point FUSELENS_CACHE_DIR elsewhere")
        foreign = _foreign_owner(st)
        if foreign:
            raise UnsafePathError(
                f"fuselens: refusing to use {real}: {foreign}; another account could place code there. "
                "Remove it or set FUSELENS_CACHE_DIR to a folder of yours."
            )
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(real, 0o700)  # ours: what others could read or write before stops now
        _checked.add(real)
        return real


def _foreign_owner(st: os.stat_result) -> str:
    """Why a file or folder with stat `st` is not ours; "" when it is (or the
    platform has no uids)."""
    if _uid() >= 0 and st.st_uid != _uid():
        return f"it belongs to uid {st.st_uid}, not to you (uid {_uid()})"
    return ""


def _make_0700(path: str) -> None:
    """Create `path` and each missing folder above it 0700 (os.makedirs gives
    the folders above the default mode)."""
    missing = []
    here = path
    while not os.path.lexists(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass


def _check_ancestors(real: str) -> None:
    """Every existing ancestor must be unwritable by others, or sticky (/tmp) and
    owned by root or us: otherwise our folder could be swapped for theirs."""
    here = os.path.dirname(real)
    while True:
        try:
            st = os.stat(here)
        except FileNotFoundError:
            st = None
        if st is not None:
            writable_by_others = stat.S_IMODE(st.st_mode) & 0o022
            sticky = st.st_mode & stat.S_ISVTX
            owner_ok = st.st_uid in (0, _uid())
            if not owner_ok or (writable_by_others and not sticky):
                raise UnsafePathError(
                    f"fuselens: refusing to use {real}: its parent {here} can be changed by other accounts "
                    f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}). Set FUSELENS_CACHE_DIR to a "
                    "folder only you can write."
                )
        parent = os.path.dirname(here)
        if parent == here:
            return
        here = parent


def check_private_file(path: str) -> str:
    """`path` if it is a regular file of ours that only we can write, in a private
    directory; call before importing, loading or reading back a cached file."""
    real = os.path.realpath(os.path.abspath(path))
    private_dir(os.path.dirname(real))
    st = os.lstat(real)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"fuselens: refusing to load {real}: not a regular file")
    foreign = _foreign_owner(st)
    if foreign:
        raise UnsafePathError(f"fuselens: refusing to load {real}: {foreign}")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UnsafePathError(f"fuselens: refusing to load {real}: other accounts can write it (mode {stat.S_IMODE(st.st_mode):o})")
    return real


# ---- scratch ---------------------------------------------------------------
_SCRATCH = "scratch"


def scratch_dir(kind: str) -> str:
    """A new private folder `<cache_root>/scratch/<kind>-<pid>-<random>`, removed at
    this process's exit (and by `clean_stale_scratch` of a later process when this
    one was killed)."""
    parent = cache_dir(_SCRATCH)
    path = os.path.join(parent, f"{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(path, 0o700)
    with _lock:
        if not _scratch:
            atexit.register(remove_scratch)
        _scratch.append(path)
    return path


def remove_scratch(path: Optional[str] = None) -> None:
    """Remove one scratch folder of this process, or all of them."""
    with _lock:
        doomed = [p for p in _scratch if path is None or p == path]
        for p in doomed:
            _scratch.remove(p)
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)


def clean_stale_scratch() -> list[str]:
    """Remove scratch folders whose process is gone; returns what was removed."""
    try:
        parent = cache_dir(_SCRATCH)
        names = os.listdir(parent)
    except (OSError, UnsafePathError):
        return []
    removed = []
    for name in names:
        parts = name.rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        if _alive(int(parts[1])):
            continue
        path = os.path.join(parent, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # not ours to signal: our own process with that pid is gone
    try:  # a zombie (killed, not yet reaped) is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True
