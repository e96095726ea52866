"""From an editor document to a `RunPlan`: which program, where, with which
options. No LSP I/O here beyond reading files."""

from __future__ import annotations

import hashlib
import os
from typing import Callable, Optional

from fuselens.server.analysis import RunPlan, contents_digest
from fuselens.server.program import ProgramText, notebook_program
from fuselens.server.project import ProjectConfig, config_for, entry_script, with_entry_setting
from fuselens.server.resolve import path_to_uri
from fuselens.server.settings import Settings


def run_options(settings: Settings, config: Optional[ProjectConfig], env: Optional[dict[str, str]] = None) -> dict:
    """RunOptions fields: the project's `[tool.fuselens]` wins over settings."""
    return {
        "backend": (config.backend if config and config.backend else settings.backend),
        "timeout_s": (config.timeout_s if config and config.timeout_s else settings.timeout_s),
        "max_calls": (config.max_calls if config and config.max_calls else settings.max_calls),
        "env": dict(env or {}),
        "compiler_options": dict(settings.compiler_options) or None,
    }


def read_text(path: str) -> str:
    """A file's text; undecodable bytes become U+FFFD (the worker reports the
    real problem when it runs the file)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def script_plan(
    uri: str,
    path: str,
    text: str,
    version: Optional[int],
    settings: Settings,
    workspace_root: Optional[str],
    open_text=lambda path: None,
) -> Optional[RunPlan]:
    """Plan for a Python document: the project's entry when configured, else
    the document itself as __main__. `workspace_root` is the trusted folder
    around it (trust.boundary_for): None when an entry would run a script
    outside it."""
    config = config_for(path, workspace_root)
    if settings.entry:
        config = with_entry_setting(config, settings.entry, workspace_root or os.path.dirname(path))
    if config is not None and config.entry and workspace_root:
        script = entry_script(config)
        if script is not None and not _inside(workspace_root, script):
            return None  # "../elsewhere.py": outside the trusted folder, never run
    doc_dir = os.path.dirname(path)
    roots = [r for r in (workspace_root, config.root if config else None, doc_dir) if r]
    options = run_options(settings, config)
    if config is not None and config.entry:
        return _entry_plan(config, uri, path, text, version, options, roots, open_text)
    cwd = config.root if config else (workspace_root if workspace_root and path.startswith(workspace_root) else doc_dir)
    return RunPlan(
        unit=uri,
        kind="script",
        value=path,
        args=[],
        cwd=cwd,
        options=options,
        program=ProgramText.for_script(path, uri, text),
        roots=roots,
        default_uri=uri,
        label=(_torchrun_label(config) if config else "") + os.path.basename(path),
        versions={uri: version} if version is not None else {},
        contents=contents_digest([text], [doc_dir]),
        nproc_per_node=config.nproc_per_node if config else None,
    )


def _entry_plan(
    config: ProjectConfig,
    uri: str,
    path: str,
    text: str,
    version: Optional[int],
    options: dict,
    roots: list[str],
    open_text: Callable[[str], Optional[str]],
) -> RunPlan:
    """Plan for the project's configured entry, run on behalf of the open
    document at `path` (whose unsaved `text` stands in when it is the entry)."""
    script = entry_script(config)
    if script is not None and os.path.realpath(script) == os.path.realpath(path):
        entry_text, entry_uri = text, uri
    elif script is not None:
        entry_text = open_text(script) or read_text(script)
        entry_uri = path_to_uri(script)
    else:
        entry_text, entry_uri = "", uri
    program = ProgramText.for_script(script, entry_uri, entry_text) if script else ProgramText("", "", [])
    return RunPlan(
        unit=f"entry:{config.root}",
        kind="entry",
        value=" ".join(config.entry),
        args=list(config.entry),
        cwd=config.root,
        options=options,
        program=program,
        roots=roots,
        default_uri=entry_uri,
        label=_torchrun_label(config) + " ".join(config.entry),
        versions={uri: version} if version is not None else {},
        contents=contents_digest([text, entry_text], [config.root], recursive=True),
        nproc_per_node=config.nproc_per_node,
    )


def notebook_plan(
    notebook_uri: str,
    notebook_path: Optional[str],
    cells: list[tuple[str, str]],
    versions: dict[str, int],
    settings: Settings,
    workspace_root: Optional[str],
    scratch_dir: str,
) -> RunPlan:
    """Plan for a notebook: code cells in order as one script written to
    `scratch_dir`; the notebook's folder is the working directory and on
    sys.path, as in Jupyter."""
    program = notebook_program(notebook_uri, cells)
    nb_dir = os.path.dirname(notebook_path) if notebook_path else (workspace_root or scratch_dir)
    config = config_for(notebook_path, workspace_root) if notebook_path else None
    stem = os.path.splitext(os.path.basename(notebook_path or "notebook"))[0]
    digest = hashlib.sha1(notebook_uri.encode()).hexdigest()[:10]
    program.path = os.path.join(scratch_dir, f"{_safe(stem)}_{digest}.py")
    pythonpath = os.pathsep.join(p for p in (nb_dir, os.environ.get("PYTHONPATH", "")) if p)
    return RunPlan(
        unit=notebook_uri,
        kind="script",
        value=program.path,
        args=[],
        cwd=nb_dir,
        options=run_options(settings, config, {"PYTHONPATH": pythonpath}),
        program=program,
        roots=[r for r in (workspace_root, nb_dir) if r],
        default_uri=cells[0][0] if cells else notebook_uri,
        label=os.path.basename(notebook_path or notebook_uri),
        versions=dict(versions),
        contents=contents_digest([program.text], [nb_dir]),
        notebook_cells=[uri for uri, _ in cells],
    )


def write_program(plan: RunPlan) -> None:
    """Write a notebook's joined script where the worker will run it."""
    os.makedirs(os.path.dirname(plan.program.path), exist_ok=True)
    tmp = plan.program.path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(plan.program.text)
    os.replace(tmp, plan.program.path)


def _torchrun_label(config: ProjectConfig) -> str:
    return f"torchrun ×{config.nproc_per_node}: " if config.nproc_per_node else ""


def _inside(root: str, path: str) -> bool:
    root, path = os.path.realpath(root), os.path.realpath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "notebook"
