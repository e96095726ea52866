"""The fuselens language server: one server object, each LSP feature a small
function. Heavy work runs in the capture worker; mapping results to LSP
objects is in diagnostics/fixes/insights (pure functions)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from urllib.parse import unquote
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import PositionCodec

from fuselens import __version__, private_dirs
from fuselens.events import Report
from fuselens.server import analysis, notifications, planning
from fuselens.server.analysis import AnalysisManager, RunPlan
from fuselens.server.diagnostics import Finding, report_findings
from fuselens.server.insights import CompiledFunction, compiled_functions
from fuselens.server.notifications import ANALYSIS_FINISHED, ANALYSIS_STARTED, AnalysisFinished, AnalysisStarted
from fuselens.server.program import split_lines
from fuselens.server.resolve import Resolver
from fuselens.server.settings import Settings
from fuselens.server.trust import any_trust, boundary_for

log = logging.getLogger(__name__)

UNTRUSTED_MESSAGE = (
    "fuselens: this workspace is not trusted, so fuselens ran no code. It analyses torch.compile by "
    "running your program; trust the workspace (in VS Code: Manage Workspace Trust), or have "
    'your editor send initializationOptions {"trusted": true} (trusts its workspace folders) or '
    '{"trustedRoots": ["/path/to/project"]}.'
)
OUTSIDE_MESSAGE = (
    "fuselens: {path} lies outside every trusted folder ({roots}), so fuselens ran nothing for it and read "
    "no configuration around it. Open its folder as a workspace folder or add it to trustedRoots."
)

# Saves closer together than this run the program once (the last save's text).
# Small against the goal of diagnostics within 1 s of the program's own run.
SAVE_DEBOUNCE_S = 0.1


@dataclass
class UnitResult:
    """The latest delivered result of one unit."""

    plan: RunPlan
    report: Report
    resolver: Resolver
    findings: dict[str, list[Finding]]
    functions: list[CompiledFunction]
    cached: bool
    result_id: str = ""
    uris: set[str] = field(default_factory=set)


class FuselensServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "fuselens",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            notebook_document_sync=types.NotebookDocumentSyncOptions(
                notebook_selector=[
                    types.NotebookDocumentFilterWithCells(
                        notebook="*", cells=[types.NotebookCellLanguage(language="python")]
                    )
                ],
                save=True,
            ),
        )
        self.settings = Settings()
        self.init_settings: Optional[Settings] = None  # from initializationOptions: trust given there stays
        self.manager = AnalysisManager(runner=self._run_plan, debounce_s=SAVE_DEBOUNCE_S)
        self.results: dict[str, UnitResult] = {}  # unit -> latest result
        self.uri_unit: dict[str, str] = {}  # document uri -> unit with results for it
        self.pull_diagnostics = False
        self.config_ready = asyncio.Event()
        self.progress_boxes: dict[str, dict[str, str]] = {}  # unit -> {"token": ...} of its run
        self.untrusted_told = False
        self.outside_told: set[str] = set()  # paths already told they lie outside trusted folders
        self._scratch_dir: Optional[str] = None
        self._result_counter = 0

    @property
    def scratch_dir(self) -> str:
        """This server's private scratch folder (0700, under the user's cache
        root), made on first use: most sessions never need it."""
        if self._scratch_dir is None:
            self._scratch_dir = private_dirs.scratch_dir("lsp")
        return self._scratch_dir

    # ---- capabilities -------------------------------------------------------
    def client_supports(self, dotted: str) -> bool:
        """Whether the client's capabilities hold a true `dotted` field
        (`"workspace.code_lens.refresh_support"`)."""
        return bool(get_capability(self.client_capabilities, dotted, False))

    @property
    def position_codec(self) -> PositionCodec:
        """Columns in the negotiated position encoding (UTF-16 before the
        client has initialized)."""
        try:
            return self.workspace.position_codec
        except RuntimeError:
            return PositionCodec()

    @property
    def encoding(self) -> str:
        encoding = self.position_codec.encoding or types.PositionEncodingKind.Utf16
        return str(getattr(encoding, "value", encoding))

    # ---- documents ----------------------------------------------------------
    def open_document(self, uri: str):
        """The open document for `uri`, or None. pygls keys documents by the
        unquoted URI while VS Code sends cell URIs percent-encoded
        (`#W0sZmlsZQ%3D%3D`), so try both spellings."""
        docs = self.workspace.text_documents
        return docs.get(uri) or docs.get(unquote(uri))

    def open_text(self, uri: str) -> Optional[str]:
        doc = self.open_document(uri)
        return doc.source if doc is not None else None

    def open_doc_by_path(self, real_path: str) -> Optional[tuple[str, list[str]]]:
        for uri, doc in list(self.workspace.text_documents.items()):
            path = to_fs_path(uri)
            if path and os.path.realpath(path) == real_path:
                return uri, split_lines(doc.source)
        return None

    def workspace_folders(self) -> list[str]:
        """The client's workspace folders (its root when it sent none)."""
        folders = [p for p in (to_fs_path(f.uri) for f in self.workspace.folders.values()) if p]
        if not folders and self.workspace.root_path:
            folders = [self.workspace.root_path]
        return folders

    def boundary_for(self, path: str) -> Optional[str]:
        """The trusted folder that bounds a run of `path` (None: `path` may not run)."""
        return boundary_for(path, self.settings, self.workspace_folders())

    def refuse_outside(self, path: str) -> None:
        """Say once per file that it lies outside every trusted folder."""
        if path in self.outside_told:
            return
        self.outside_told.add(path)
        from fuselens.server.trust import trusted_roots

        roots = ", ".join(trusted_roots(self.settings, self.workspace_folders())) or "none"
        message = OUTSIDE_MESSAGE.format(path=path, roots=roots)
        log.warning(message)
        self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))

    def plan_for(self, uri: str) -> Optional[RunPlan]:
        """The run plan for a text document or notebook (cell) URI."""
        notebook = self.workspace.get_notebook_document(notebook_uri=uri) or self.workspace.get_notebook_document(cell_uri=uri)
        if notebook is not None:
            return self._notebook_plan(notebook)
        path = to_fs_path(uri)
        if not path or not uri.startswith("file:"):
            log.info("not analysing %s: not a file on disk", uri)
            return None
        boundary = self.boundary_for(path)
        if boundary is None:
            self.refuse_outside(path)
            return None
        doc = self.open_document(uri)
        text = doc.source if doc is not None else planning.read_text(path)
        version = doc.version if doc is not None else None
        plan = planning.script_plan(
            uri, path, text, version, self.settings, boundary,
            open_text=lambda p: self.open_text(_file_uri(p)),
        )
        if plan is None:
            self.refuse_outside(path)
        return plan

    def _notebook_plan(self, notebook: types.NotebookDocument) -> Optional[RunPlan]:
        cells, versions = [], {}
        for cell in notebook.cells:
            if cell.kind != types.NotebookCellKind.Code:
                continue
            doc = self.open_document(cell.document)
            if doc is None or (doc.language_id or "python") != "python":
                continue
            cells.append((cell.document, doc.source))
            if doc.version is not None:
                versions[cell.document] = doc.version
        path = to_fs_path(notebook.uri) if notebook.uri.startswith("file:") else None
        root = self.boundary_for(path) if path else None
        if root is None:  # an unsaved notebook has no folder, so no trusted one
            self.refuse_outside(path or notebook.uri)
            return None
        return planning.notebook_plan(notebook.uri, path, cells, versions, self.settings, root, self.scratch_dir)

    # ---- running ------------------------------------------------------------
    async def _run_plan(self, plan: RunPlan, on_event) -> Report:
        if plan.program.notebook_uri:
            planning.write_program(plan)
        return await analysis.run_plan(plan, on_event)

    def warm_up(self) -> None:
        """Start a worker (Python, torch, hooks) before the first save needs
        it, once some folder is trusted: from the first trusted folder, which
        is the worker's cwd while it imports."""
        from fuselens.server.trust import trusted_roots

        roots = [r for r in trusted_roots(self.settings, self.workspace_folders()) if os.path.isdir(r)]
        if not roots or self.settings.run_on == "manual":
            return
        from fuselens.capture.runner import prestart

        try:
            prestart(roots[0])
        except OSError:
            log.warning("could not start a spare worker", exc_info=True)

    def tell_untrusted(self) -> None:
        if not self.untrusted_told:
            self.untrusted_told = True
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Info, message=UNTRUSTED_MESSAGE))

    def schedule(self, uri: str, use_cache: bool = True) -> Optional[asyncio.Task]:
        """Analyse the unit of `uri` now (cancelling its running analysis)."""
        if not any_trust(self.settings):
            self.tell_untrusted()
            return None
        plan = self.plan_for(uri)
        if plan is None:
            return None
        task = self.manager.submit(plan, self.deliver, self._progress_events(plan), use_cache)
        if task is not None:
            self.protocol.notify(ANALYSIS_STARTED, AnalysisStarted(uri=notifications.subject_uri(plan)))
            before = self.results.get(plan.unit)
            task.add_done_callback(lambda t: self._tell_cancelled(plan, t, before))
            asyncio.ensure_future(self._track_progress(plan, task))
        return task

    def _tell_cancelled(self, plan: RunPlan, task: asyncio.Task, before: Optional[UnitResult]) -> None:
        """A cancelled run delivers nothing: say it ended, unless what
        cancelled it says so itself (a newer run of its unit under way, or a
        newer result, from the cache, already delivered)."""
        newer = self.manager.running(plan.unit) or self.results.get(plan.unit) is not before
        if task.cancelled() and not newer:
            self.protocol.notify(ANALYSIS_FINISHED, AnalysisFinished.cancelled(plan))

    def deliver_cached(self, uri: str) -> bool:
        """Publish cached results for `uri` without running anything."""
        if not any_trust(self.settings):
            return False
        plan = self.plan_for(uri)
        report = self.manager.cached(plan) if plan is not None else None
        if report is None:
            return False
        self.deliver(plan, report, True)
        return True

    def _progress_events(self, plan: RunPlan):
        counts = {"events": 0, "breaks": 0, "graphs": 0, "last": 0.0}
        plan.options = dict(plan.options)
        token_box: dict[str, str] = {}
        self.progress_boxes[plan.unit] = token_box

        def on_event(event: Any) -> None:
            name = type(event).__name__
            counts["events"] += 1
            counts["breaks"] += name == "GraphBreak"
            counts["graphs"] += name == "CompiledGraph"
            now = time.monotonic()
            token = token_box.get("token")
            if token and now - counts["last"] > 0.25:
                counts["last"] = now
                msg = f"{plan.label}: {counts['graphs']} graph(s), {counts['breaks']} break(s) so far"
                try:
                    self.work_done_progress.report(token, types.WorkDoneProgressReport(message=msg))
                except Exception:
                    log.debug("progress report failed", exc_info=True)

        return on_event

    async def _track_progress(self, plan: RunPlan, task: asyncio.Task) -> None:
        """Work-done progress for one analysis; cancelling it cancels the run."""
        if not self.client_supports("window.work_done_progress"):
            return
        token = f"fuselens-{uuid.uuid4().hex[:12]}"
        try:
            await asyncio.wait_for(self.work_done_progress.create_async(token), 5)
        except Exception:
            log.debug("client refused progress token", exc_info=True)
            return
        progress = self.work_done_progress
        progress.begin(token, types.WorkDoneProgressBegin(title="fuselens", message=f"running {plan.label}", cancellable=True))
        self.progress_boxes.get(plan.unit, {})["token"] = token
        future = progress.tokens.get(token)
        if future is not None:
            future.add_done_callback(lambda f: task.cancel() if f.cancelled() and not task.done() else None)
        try:
            await asyncio.wait({task})
        finally:
            self.progress_boxes.get(plan.unit, {}).pop("token", None)  # no report after the end
            message = "cancelled" if task.cancelled() else "done"
            progress.end(token, types.WorkDoneProgressEnd(message=message))
            progress.tokens.pop(token, None)

    # ---- delivering ---------------------------------------------------------
    def deliver(self, plan: RunPlan, report: Report, cached: bool) -> None:
        resolver = Resolver(
            plan.program, plan.roots, self.position_codec, self.open_doc_by_path, plan.notebook_cells, plan.default_uri
        )
        findings = report_findings(report, resolver)
        functions = compiled_functions(report, resolver)
        self._result_counter += 1
        result = UnitResult(plan, report, resolver, findings, functions, cached, str(self._result_counter))
        result.uris = set(findings) | set(plan.program.uris) | {f.uri for f in functions}
        previous = self.results.get(plan.unit)
        self.results[plan.unit] = result
        stale_uris = (previous.uris - result.uris) if previous else set()
        for uri in result.uris:
            self.uri_unit[uri] = plan.unit
        for uri in sorted(result.uris | stale_uris):
            self.publish(uri, [f.diagnostic for f in findings.get(uri, [])], plan.versions.get(uri))
        if self.pull_diagnostics:  # chosen only for clients that support the refresh
            self.workspace_diagnostic_refresh(None)
        if self.client_supports("workspace.code_lens.refresh_support"):
            self.workspace_code_lens_refresh(None)
        if self.settings.inlay_hints and self.client_supports("workspace.inlay_hint.refresh_support"):
            self.workspace_inlay_hint_refresh(None)
        self.protocol.notify(ANALYSIS_FINISHED, AnalysisFinished.of(plan, report, cached))

    def publish(self, uri: str, diagnostics: list[types.Diagnostic], version: Optional[int]) -> None:
        if self.pull_diagnostics:
            return  # the client pulls (textDocument/diagnostic); never both
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=version)
        )

    def result_for(self, uri: str) -> Optional[UnitResult]:
        unit = self.uri_unit.get(uri)
        return self.results.get(unit) if unit else None

    def findings_for(self, uri: str) -> list[Finding]:
        result = self.result_for(uri)
        return result.findings.get(uri, []) if result else []

    # ---- errors -------------------------------------------------------------
    def report_server_error(self, error: Exception, source: Any) -> None:
        """Log instead of popping a message: a bad request is not the user's
        problem, and the server goes on."""
        log.error("server error (%s): %s", getattr(source, "__name__", source), error)
        try:
            self.window_log_message(types.LogMessageParams(type=types.MessageType.Error, message=f"fuselens: {error}"))
        except Exception:
            pass

    def cleanup(self) -> None:
        """Stop the spare worker and remove this server's scratch folder (also
        done at exit and, after a SIGKILL, by the next server's start)."""
        if "fuselens.capture.runner" in sys.modules:
            sys.modules["fuselens.capture.runner"].stop_spares()
        if self._scratch_dir is not None:
            private_dirs.remove_scratch(self._scratch_dir)
            self._scratch_dir = None


def _file_uri(path: str) -> str:
    from fuselens.server.resolve import path_to_uri

    return path_to_uri(path)
