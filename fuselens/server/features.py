"""LSP features of the fuselens server: one server object, each feature a
top-level function registered on it by pygls's decorator (commands are in
commands.py). Importing this module builds the server and starts nothing."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

from lsprotocol import types
from pygls.uris import to_fs_path
from pygls.workspace import PositionCodec

from fuselens.server import insights
from fuselens.server.fixes import Edit, fixes_for
from fuselens.server.program import ProgramText
from fuselens.server.server import FuselensServer
from fuselens.server.settings import Settings
from fuselens.server.trust import any_trust

log = logging.getLogger(__name__)

server = FuselensServer()


def is_python(doc: types.TextDocumentItem) -> bool:
    return doc.language_id == "python" or doc.uri.endswith((".py", ".pyw"))


# ---- lifecycle and configuration ------------------------------------------------


@server.feature(types.INITIALIZE)
def initialize(ls: FuselensServer, params: types.InitializeParams) -> None:
    ls.settings = ls.init_settings = Settings().merged(params.initialization_options)
    tell_problems(ls, ls.settings)
    # Pull only where the server can tell the client to pull again after a
    # run (workspace/diagnostic/refresh). Neovim 0.10/0.11 advertise pull
    # diagnostics without refresh: pulled, results of a run started by
    # :w would only show at the next edit. Such clients get pushes. Registered
    # here, before pygls builds the capabilities it answers with.
    if ls.client_supports("text_document.diagnostic") and ls.client_supports("workspace.diagnostics.refresh_support"):
        ls.pull_diagnostics = True
        ls.feature(
            types.TEXT_DOCUMENT_DIAGNOSTIC,
            types.DiagnosticOptions(identifier="fuselens", inter_file_dependencies=True, workspace_diagnostics=False),
        )(pull_diagnostics)
    # Trust named at initialization (trusted, trustedRoots): the worker's
    # torch import starts now, before the configuration round trip.
    ls.warm_up()


@server.feature(types.INITIALIZED)
async def initialized(ls: FuselensServer, params: types.InitializedParams) -> None:
    try:
        await pull_configuration(ls)
    finally:
        ls.config_ready.set()
    ls.warm_up()  # trust from the configuration: the first save need not wait for torch


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: FuselensServer, params: types.DidChangeConfigurationParams) -> None:
    was_trusted = (ls.settings.trusted, ls.settings.trusted_roots)
    if params.settings:
        apply_settings(ls, params.settings)
    else:
        await pull_configuration(ls)
    now_trusted = (ls.settings.trusted, ls.settings.trusted_roots)
    if any_trust(ls.settings) and now_trusted != was_trusted and ls.settings.run_on != "manual":
        ls.warm_up()
        for uri in open_units(ls):
            ls.schedule(uri)


@server.feature(types.SHUTDOWN)
def shutdown(ls: FuselensServer, params: Any) -> None:
    for unit in list(ls.manager.tasks):
        ls.manager.cancel(unit)
    ls.cleanup()


def apply_settings(ls: FuselensServer, raw: Any) -> None:
    merged = ls.settings.merged(raw)
    # Trust granted at initialization (the editor's workspace trust, the
    # roots a Neovim config names) is not taken back by a configuration
    # section that merely has the default.
    init = ls.init_settings
    if init and init.trusted:
        merged.trusted = True
    if init and init.trusted_roots:
        merged.trusted_roots = tuple(dict.fromkeys(init.trusted_roots + merged.trusted_roots))
    ls.settings = merged
    tell_problems(ls, merged)


def tell_problems(ls: FuselensServer, settings: Settings) -> None:
    for problem in settings.problems:
        log.warning(problem)
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=problem))


async def pull_configuration(ls: FuselensServer) -> None:
    if not ls.client_supports("workspace.configuration"):
        return
    try:
        items = [types.ConfigurationItem(section="fuselens")]
        result = await asyncio.wait_for(ls.workspace_configuration_async(types.ConfigurationParams(items=items)), 3)
    except Exception:
        log.debug("workspace/configuration failed", exc_info=True)
        return
    if result and isinstance(result[0], dict):
        apply_settings(ls, {"fuselens": result[0]})


async def wait_config(ls: FuselensServer) -> None:
    """Documents opened before the configuration arrived wait for it (a few
    seconds at most): it decides trust and when to run."""
    try:
        await asyncio.wait_for(ls.config_ready.wait(), 3)
    except asyncio.TimeoutError:
        pass


# ---- documents --------------------------------------------------------------------


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
async def did_open(ls: FuselensServer, params: types.DidOpenTextDocumentParams) -> None:
    await wait_config(ls)
    doc = params.text_document
    if is_python(doc) and ls.workspace.get_notebook_document(cell_uri=doc.uri) is None:
        on_open(ls, doc.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
async def did_save(ls: FuselensServer, params: types.DidSaveTextDocumentParams) -> None:
    await wait_config(ls)
    uri = params.text_document.uri
    if ls.settings.run_on == "manual":
        return
    if uri.endswith((".py", ".pyw")) or uri in ls.uri_unit:
        ls.schedule(uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: FuselensServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    if not ls.pull_diagnostics and uri in ls.uri_unit:
        ls.publish(uri, [], None)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
async def notebook_did_open(ls: FuselensServer, params: types.DidOpenNotebookDocumentParams) -> None:
    await wait_config(ls)
    on_open(ls, params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
async def notebook_did_save(ls: FuselensServer, params: types.DidSaveNotebookDocumentParams) -> None:
    await wait_config(ls)
    if ls.settings.run_on != "manual":
        ls.schedule(params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
def notebook_did_close(ls: FuselensServer, params: types.DidCloseNotebookDocumentParams) -> None:
    ls.manager.cancel(params.notebook_document.uri)
    if not ls.pull_diagnostics:
        for cell in params.cell_text_documents:
            ls.publish(cell.uri, [], None)


def on_open(ls: FuselensServer, uri: str) -> None:
    if ls.settings.run_on == "manual":
        return
    if not any_trust(ls.settings):
        ls.tell_untrusted()
    elif ls.settings.run_on == "open":
        ls.schedule(uri)
    else:
        ls.deliver_cached(uri)  # results of an earlier run, no code runs


# ---- language features ----------------------------------------------------------


def pull_diagnostics(ls: FuselensServer, params: types.DocumentDiagnosticParams) -> types.DocumentDiagnosticReport:
    """textDocument/diagnostic, registered by `initialize` for clients that can be told to pull again."""
    uri = params.text_document.uri
    result = ls.result_for(uri)
    result_id = result.result_id if result else "0"
    if params.previous_result_id == result_id:
        return types.RelatedUnchangedDocumentDiagnosticReport(result_id=result_id)
    items = [f.diagnostic for f in ls.findings_for(uri)]
    return types.RelatedFullDocumentDiagnosticReport(items=items, result_id=result_id)


@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: FuselensServer, params: types.HoverParams) -> Optional[types.Hover]:
    uri, result = params.text_document.uri, ls.result_for(params.text_document.uri)
    if result is None:
        return None
    return insights.hover(result.report, result.resolver, result.functions, uri, params.position.line)


@server.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))
def code_lens(ls: FuselensServer, params: types.CodeLensParams) -> list[types.CodeLens]:
    uri, result = params.text_document.uri, ls.result_for(params.text_document.uri)
    return insights.code_lenses(result.functions, uri, result.resolver) if result else []


@server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=False))
def inlay_hint(ls: FuselensServer, params: types.InlayHintParams) -> list[types.InlayHint]:
    uri, result = params.text_document.uri, ls.result_for(params.text_document.uri)
    if result is None or not ls.settings.inlay_hints:
        return []
    return insights.inlay_hints(result.report, result.resolver, uri, params.range.start.line, params.range.end.line)


@server.feature(types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
def code_action(ls: FuselensServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    return code_actions(ls, params)


def open_units(ls: FuselensServer) -> list[str]:
    """One URI per open unit: Python documents and notebooks."""
    cells = {c.document for nb in ls.workspace.notebook_documents.values() for c in nb.cells}
    uris = [u for u, d in ls.workspace.text_documents.items() if u not in cells and u.endswith((".py", ".pyw"))]
    return uris + list(ls.workspace.notebook_documents)


def code_actions(ls: FuselensServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    uri = params.text_document.uri
    wanted = params.context.only
    if wanted and not any(str(k).startswith("quickfix") for k in wanted):
        return []
    findings = [f for f in ls.findings_for(uri) if _overlaps(f.diagnostic.range, params.range)]
    if not findings:
        return []
    program = current_program(ls, uri)
    if program is None:
        return []
    actions = []
    for finding in findings:
        line = program.to_program(uri, finding.line)
        if line is None:
            continue
        for fix in fixes_for(program.text, finding.event, line):
            changes = _document_edits(program, fix.edits, ls.position_codec)
            if changes:
                actions.append(
                    types.CodeAction(
                        title=fix.title,
                        kind=types.CodeActionKind.QuickFix,
                        diagnostics=[finding.diagnostic],
                        edit=types.WorkspaceEdit(changes=changes),
                        is_preferred=fix.preferred or None,
                    )
                )
    return actions


def current_program(ls: FuselensServer, uri: str) -> Optional[ProgramText]:
    """The program around `uri` with the editor's current text."""
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    if notebook is not None:
        plan = ls._notebook_plan(notebook)
        return plan.program if plan is not None else None
    path = to_fs_path(uri)
    text = ls.open_text(uri)
    if text is None and path:
        from fuselens.server.planning import read_text

        text = read_text(path)
    return ProgramText.for_script(path or "", uri, text) if text is not None else None


def _document_edits(program: ProgramText, edits: list[Edit], codec: PositionCodec) -> dict[str, list[types.TextEdit]]:
    """Program-coordinate edits -> per-document TextEdits in client units."""
    out: dict[str, list[types.TextEdit]] = {}
    for edit in edits:
        seg = next((s for s in program.segments if s.start <= edit.line <= s.start + len(s.lines)), None)
        if seg is None:
            return {}
        start_line, end_line = edit.line - seg.start, edit.end_line - seg.start
        if end_line > len(seg.lines):
            return {}  # would cross into the next cell
        start_text = seg.lines[start_line] if start_line < len(seg.lines) else ""
        end_text = seg.lines[end_line] if end_line < len(seg.lines) else ""
        rng = types.Range(
            start=types.Position(line=start_line, character=codec.client_num_units(start_text[: max(0, edit.col)])),
            end=types.Position(line=end_line, character=codec.client_num_units(end_text[: max(0, edit.end_col)])),
        )
        out.setdefault(seg.uri, []).append(types.TextEdit(range=rng, new_text=edit.text))
    return out


def _overlaps(a: types.Range, b: types.Range) -> bool:
    return not (a.end.line < b.start.line or b.end.line < a.start.line)
