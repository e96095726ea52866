"""Test helpers: a real pytest-lsp client talking to a real `fuselens server`
process over stdio. Imported by tests/test_server_*.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import sys
import time
from typing import Any, AsyncIterator, Callable, Optional

from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities
from pytest_lsp.client import make_test_lsp_client

HERE = pathlib.Path(__file__).parent
SERVER = [sys.executable, "-m", "fuselens", "server"]


def uri(path: os.PathLike | str) -> str:
    return pathlib.Path(path).resolve().as_uri()


def capabilities(pull: bool = False, encodings: Optional[list[str]] = None, refresh: bool = True) -> types.ClientCapabilities:
    """VS Code's capabilities; without `pull` the pull-diagnostics capability
    is removed so the server must push. `pull` without `refresh` is Neovim
    0.10/0.11: pull diagnostics but no workspace/diagnostic/refresh."""
    caps = client_capabilities("visual-studio-code")
    if pull:  # VS Code pulls; the recorded capabilities predate pull diagnostics
        caps.text_document.diagnostic = types.DiagnosticClientCapabilities(related_document_support=False)
        caps.workspace.diagnostics = types.DiagnosticWorkspaceClientCapabilities(refresh_support=refresh)
    else:
        caps.text_document.diagnostic = None
    if encodings is not None:
        caps.general.position_encodings = encodings
    return caps


@contextlib.asynccontextmanager
async def session(
    root: os.PathLike | str,
    *,
    init: Optional[dict[str, Any]] = None,
    pull: bool = False,
    encodings: Optional[list[str]] = None,
    configuration: Optional[dict[str, Any]] = None,
    refresh: bool = True,
) -> AsyncIterator[LanguageClient]:
    """A started, initialized client; shut down (and the server reaped) after."""
    client = make_test_lsp_client()
    if configuration is not None:
        client.set_configuration(configuration, section="fuselens")
    await client.start_io(*SERVER)
    params = types.InitializeParams(
        capabilities=capabilities(pull, encodings, refresh),
        root_uri=uri(root),
        workspace_folders=[types.WorkspaceFolder(uri=uri(root), name="ws")],
        initialization_options=init if init is not None else {"trusted": True},
    )
    client.init_result = await client.initialize_session(params)
    try:
        yield client
    finally:
        try:
            await asyncio.wait_for(client.shutdown_session(), 15)
        finally:
            await client.stop()


def open_file(client: LanguageClient, path: pathlib.Path, text: Optional[str] = None, version: int = 1) -> str:
    doc_uri = uri(path)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=doc_uri, language_id="python", version=version,
                                   text=text if text is not None else path.read_text(encoding="utf-8", errors="replace"))
        )
    )
    return doc_uri


def save_file(client: LanguageClient, path: pathlib.Path) -> None:
    client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri=uri(path))))


def change_file(client: LanguageClient, path: pathlib.Path, text: str, version: int) -> None:
    """Write `text` to disk and tell the server (full-text change)."""
    path.write_text(text, encoding="utf-8")
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri(path), version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


async def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05) -> Any:
    """Poll client state (pytest-lsp keeps one waiter per method, so polling
    is the reliable way to wait for notifications)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {getattr(predicate, '__name__', predicate)}")


def diagnostics(client: LanguageClient, doc_uri: str, code: Optional[str] = None) -> list[types.Diagnostic]:
    return [d for d in client.diagnostics.get(doc_uri, []) if code is None or d.code == code]


async def command(client: LanguageClient, name: str, *args: Any, timeout: float = 120) -> Any:
    return await asyncio.wait_for(
        client.workspace_execute_command_async(types.ExecuteCommandParams(command=name, arguments=list(args))), timeout
    )


async def code_actions(client: LanguageClient, doc_uri: str, diagnostic: types.Diagnostic) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=doc_uri),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    return [a for a in (result or []) if isinstance(a, types.CodeAction)]


def apply_text_edits(text: str, edits: list[types.TextEdit], encoding: str = "utf-16") -> str:
    """Apply LSP TextEdits the way an editor does (independently of the
    server's own code), in the given position encoding."""
    lines = text.split("\n")

    def offset(pos: types.Position) -> int:
        base = sum(len(l) + 1 for l in lines[: pos.line])
        if pos.line >= len(lines):
            return len(text)
        line = lines[pos.line]
        units, col = 0, 0
        for ch in line:
            if units >= pos.character:
                break
            units += len(ch.encode("utf-16-le")) // 2 if encoding == "utf-16" else len(ch.encode()) if encoding == "utf-8" else 1
            col += 1
        return base + col

    out = text
    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        a, b = offset(edit.range.start), offset(edit.range.end)
        out = out[:a] + edit.new_text + out[b:]
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
