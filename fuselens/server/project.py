"""Which program to run for a document: `[tool.fuselens]` of the workspace's
pyproject.toml, or the document itself as `__main__`.

    [tool.fuselens]
    entry = "train.py --steps 2"   # or "-m pkg.train --steps 2"
    backend = "eager"              # force a backend on every torch.compile
    timeout = 60                   # seconds
    max_calls = 3                  # stop once every compiled function ran 3 times
    nproc_per_node = 2             # run the entry with torchrun on 2 ranks, every rank captured
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ProjectConfig:
    """`[tool.fuselens]` of one pyproject.toml. `root` is its directory."""

    root: str
    entry: list[str] = field(default_factory=list)  # shlex-split entry, [] = the document itself
    backend: Optional[str] = None
    timeout_s: Optional[float] = None
    max_calls: Optional[int] = None
    nproc_per_node: Optional[int] = None  # torchrun: ranks on this host; None = one plain process
    problems: list[str] = field(default_factory=list)  # what was ignored, for the log


def find_pyproject(start_dir: str, stop_dir: str) -> Optional[str]:
    """The nearest pyproject.toml from `start_dir` upwards, never above `stop_dir`
    (the trusted folder): a file there would make an untrusted folder's
    `[tool.fuselens] entry` run. None when `start_dir` is not inside `stop_dir`."""
    here = os.path.realpath(start_dir)
    stop = os.path.realpath(stop_dir)
    if here != stop and not here.startswith(stop.rstrip(os.sep) + os.sep):
        return None
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if here == stop or parent == here:
            return None
        here = parent


def load_config(pyproject_path: str) -> ProjectConfig:
    """Parse `[tool.fuselens]`; a broken file or a wrong value is reported in
    `problems` and otherwise ignored (the document then runs by itself)."""
    config = ProjectConfig(root=os.path.dirname(os.path.abspath(pyproject_path)))
    try:
        with open(pyproject_path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        config.problems.append(f"{pyproject_path}: {exc}")
        return config
    section = data.get("tool", {}).get("fuselens", {})
    if not isinstance(section, dict):
        config.problems.append("[tool.fuselens] is not a table")
        return config
    _apply(config, section)
    return config


def _apply(config: ProjectConfig, section: dict[str, Any]) -> None:
    entry = section.get("entry")
    if isinstance(entry, str) and entry.strip():
        try:
            config.entry = shlex.split(entry)
        except ValueError as exc:
            config.problems.append(f"entry: {exc}")
    elif isinstance(entry, list) and all(isinstance(a, str) for a in entry):
        config.entry = list(entry)
    elif entry is not None:
        config.problems.append("entry must be a string like \"train.py --steps 2\"")
    backend = section.get("backend")
    if isinstance(backend, str) and backend:
        config.backend = backend
    elif backend is not None:
        config.problems.append("backend must be a string")
    timeout = section.get("timeout")
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
        config.timeout_s = float(timeout)
    elif timeout is not None:
        config.problems.append("timeout must be a positive number of seconds")
    max_calls = section.get("max_calls")
    if isinstance(max_calls, int) and not isinstance(max_calls, bool) and max_calls > 0:
        config.max_calls = max_calls
    elif max_calls is not None:
        config.problems.append("max_calls must be a positive integer")
    nproc = section.get("nproc_per_node")
    if isinstance(nproc, int) and not isinstance(nproc, bool) and nproc > 0:
        config.nproc_per_node = nproc
    elif nproc is not None:
        config.problems.append("nproc_per_node must be a positive integer (ranks torchrun starts on this host)")


def config_for(document_path: str, workspace_root: Optional[str]) -> Optional[ProjectConfig]:
    """The project config that applies to a document, if any: only from inside
    `workspace_root` (the trusted folder); without one, none."""
    if not workspace_root:
        return None
    path = find_pyproject(os.path.dirname(os.path.abspath(document_path)), workspace_root)
    return load_config(path) if path else None


def entry_script(config: ProjectConfig) -> Optional[str]:
    """Absolute path of the entry script (None for `-m module` entries)."""
    if not config.entry or config.entry[0].startswith("-"):
        return None
    return os.path.normpath(os.path.join(config.root, config.entry[0]))


def with_entry_setting(config: Optional[ProjectConfig], entry: str, root: str) -> ProjectConfig:
    """The editor's `fuselens.entry` setting wins over `[tool.fuselens] entry`;
    it is relative to the workspace folder. The project's other values stay."""
    merged = dataclasses.replace(config, entry=[]) if config is not None else ProjectConfig(root=root)
    if config is None or not config.root:
        merged.root = root
    _apply(merged, {"entry": entry})
    return merged
