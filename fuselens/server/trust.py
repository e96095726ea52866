"""Which files the server may run, and where their configuration may come from.

Trust is per folder, never global:

* `trusted: true` (the editor's workspace trust, e.g. VS Code) trusts the
  workspace folders the client opened, and nothing above or beside them;
* `trustedRoots: ["/home/me/src/proj", ...]` trusts those folders by name (what
  a Neovim config says, so that opening some random file runs nothing).

A file runs only when a trusted root contains it. Its *boundary* is the deepest
trusted root or workspace folder that contains it: the `pyproject.toml` search
stops there, and a configured entry must lie inside it. So a file outside the
trusted folder cannot make an ancestor folder's `[tool.fuselens] entry` run.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

from fuselens.server.settings import Settings


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(path)))


def contains(root: str, path: str) -> bool:
    """`path` is `root` or lies below it (both already real paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def trusted_roots(settings: Settings, workspace_folders: Iterable[str]) -> list[str]:
    """The real paths of every trusted folder."""
    roots = [_real(f) for f in workspace_folders if f] if settings.trusted else []
    roots += [_real(r) for r in settings.trusted_roots if os.path.isabs(os.path.expanduser(r))]
    return sorted(set(roots))


def boundary_for(path: str, settings: Settings, workspace_folders: Iterable[str]) -> Optional[str]:
    """The folder that bounds `path`'s run and configuration, or None when no
    trusted root contains `path` (then nothing of it may run)."""
    real = _real(path)
    folders = [_real(f) for f in workspace_folders if f]
    if not any(contains(root, real) for root in trusted_roots(settings, folders)):
        return None
    around = [f for f in folders + trusted_roots(settings, folders) if contains(f, real)]
    return max(around, key=len)


def any_trust(settings: Settings) -> bool:
    """Whether anything at all may run (else the user hears why nothing does)."""
    return settings.trusted or bool(settings.trusted_roots)
