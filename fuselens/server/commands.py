"""`workspace/executeCommand` commands of the fuselens server, each a
top-level function on the server of features.py. pygls structures each
argument by its annotation, so a call with arguments of the wrong shape is
answered with InvalidParams before any handler runs."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import attrs
from pygls.protocol import default_converter

from fuselens.server.analysis import summary
from fuselens.server.features import server
from fuselens.server.server import FuselensServer, UnitResult
from fuselens.server.trust import any_trust

log = logging.getLogger(__name__)

ANALYZE = "fuselens.analyze"
CANCEL = "fuselens.cancel"
KERNEL_SOURCE = "fuselens.kernelSource"
WRITE_REPORT = "fuselens.writeReport"
SERVER_INFO = "fuselens.serverInfo"

# pygls has no optional trailing arguments (it wants one value per
# parameter), so `fuselens.analyze`'s options are read from `*options` by
# the same kind of converter pygls uses for the rest.
_converter = default_converter()


@attrs.define
class AnalyzeOptions:
    """`fuselens.analyze [uri, {"force": true}]`: run even when the cache has an answer."""

    force: bool = False


@server.command(ANALYZE)
async def analyze(ls: FuselensServer, uri: str, *options: Any) -> dict[str, Any]:
    """Run now (cache bypassed with {"force": true}); returns a summary."""
    force = any(_converter.structure(o, AnalyzeOptions).force for o in options)
    if not any_trust(ls.settings):
        ls.tell_untrusted()
        return {"status": "untrusted"}
    plan = ls.plan_for(uri)
    if plan is None:
        return {"status": "outside-trusted-folders"}
    task = ls.schedule(uri, use_cache=not force)
    if task is None:
        report = ls.manager.cached(plan)
        return summary(report, "ok" if report else "not-analysed", cached=True)
    try:
        report = await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # the client cancelled this request: the run was cancelled with it
        return {"status": "cancelled"}
    return summary(report, "ok" if report is not None else "superseded")


@server.command(CANCEL)
def cancel(ls: FuselensServer, uri: str) -> dict[str, Any]:
    """Cancel the running analysis of the unit of `uri` (a cell cancels its notebook)."""
    result = ls.result_for(uri)
    unit = result.plan.unit if result else uri
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    return {"cancelled": ls.manager.cancel(notebook.uri if notebook else unit)}


@server.command(KERNEL_SOURCE)
def kernel_source(ls: FuselensServer, uri: str, name: str) -> dict[str, Any]:
    """The generated source of kernel `name` of the latest analysis of `uri`
    (of any analysis when `uri` has none; the first kernel when `name` is empty)."""
    found = ls.result_for(uri)
    for result in [found] if found else list(ls.results.values()):
        for kernel in result.report.kernels:
            if kernel.name == name or not name:
                return {"name": kernel.name, "language": kernel.language, "kind": kernel.kind,
                        "graph_id": kernel.graph_id, "source": kernel.source}
    return {"name": name, "source": "", "error": "no such kernel in the latest analysis"}


@server.command(WRITE_REPORT)
def write_report(ls: FuselensServer, uri: str) -> dict[str, Any]:
    """Write the report of the latest analysis of `uri` to the scratch folder."""
    result = ls.result_for(uri)
    if result is None:
        return {"error": "no analysis for this document yet"}
    return write_report_file(ls, result)


@server.command(SERVER_INFO)
def server_info(ls: FuselensServer) -> dict[str, Any]:
    """Facts about this server process, for editor health checks and tests."""
    return {
        "pid": os.getpid(),
        "torch_imported": "torch" in sys.modules,
        "rss_kb": _rss_kb(),
        "encoding": ls.encoding,
        "pull_diagnostics": ls.pull_diagnostics,
        "trusted": ls.settings.trusted,
        "trusted_roots": list(ls.settings.trusted_roots),
        "run_on": ls.settings.run_on,
        "worker_warm": _worker_warm(),
        "running": sum(1 for unit in list(ls.manager.tasks) if ls.manager.running(unit)),
    }


def write_report_file(ls: FuselensServer, result: UnitResult) -> dict[str, Any]:
    """Write the HTML report of a result (JSON when HTML cannot be made)."""
    stem = os.path.splitext(os.path.basename(result.plan.label.split()[0] if result.plan.label else "report"))[0]
    try:
        from fuselens.report.html import render_html

        text, ext = render_html(result.report, root=result.plan.cwd), "html"
    except Exception as exc:  # the renderer is optional for the server
        log.warning("HTML report failed (%s); writing JSON", exc)
        text, ext = result.report.to_json(), "json"
    path = os.path.join(ls.scratch_dir, f"{stem}-report.{ext}")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    from fuselens.server.resolve import path_to_uri

    return {"path": path, "uri": path_to_uri(path), "format": ext}


def _worker_warm() -> bool:
    """A spare worker has imported torch and waits for the next run."""
    runner = sys.modules.get("fuselens.capture.runner")
    return bool(runner is not None and runner.spare_ready())


def _rss_kb() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
