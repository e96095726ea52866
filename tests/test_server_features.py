"""End-to-end: a real pytest-lsp client drives a real `fuselens server`
process, which runs the example programs in the real capture worker.

Graph breaks and recompiles come from Dynamo with backend="eager". Fusion
diagnostics come from recorded events replayed through the worker's event
sink (tests/lsp_workspaces/basic/fusion_replay.py), not from a compile.
"""

from __future__ import annotations

import ast
import shutil

import pytest
from lsprotocol import types

from lsp_workspaces.harness import (
    HERE,
    apply_text_edits,
    code_actions,
    command,
    diagnostics,
    open_file,
    save_file,
    session,
    uri,
    wait_until,
)


@pytest.fixture
def ws(tmp_path):
    shutil.copytree(HERE / "basic", tmp_path / "basic")
    return tmp_path / "basic"


def _apply(text: str, action: types.CodeAction, doc_uri: str, encoding: str = "utf-16") -> str:
    assert action.kind == types.CodeActionKind.QuickFix
    assert set(action.edit.changes) == {doc_uri}
    return apply_text_edits(text, list(action.edit.changes[doc_uri]), encoding)


async def test_recompile_on_new_batch_size_offers_mark_dynamic_and_dynamic_true(ws):
    path = ws / "recompile.py"
    text = path.read_text()
    async with session(ws) as client:
        doc = open_file(client, path)
        save_file(client, path)
        (diag,) = await wait_until(lambda: diagnostics(client, doc, "recompile"), 90)
        assert diag.source == "fuselens"
        assert diag.range.start.line == 3  # the @torch.compile line of `scale`
        assert "size mismatch" in diag.message and "x.size(0) changed 4 -> 8" in diag.message

        actions = await code_actions(client, doc, diag)
        titles = [a.title for a in actions]
        assert len(actions) == 2, titles
        mark, dynamic = actions
        # Unverified (the server does not re-run the program): offered, never preferred.
        assert "mark_dynamic" in mark.title and not mark.is_preferred
        fixed = _apply(text, mark, doc)
        ast.parse(fixed)
        assert "    torch._dynamo.mark_dynamic(batch, 0)\n    scale(batch)" in fixed
        fixed = _apply(text, dynamic, doc)
        ast.parse(fixed)
        assert '@torch.compile(backend="eager", dynamic=True)' in fixed

        lenses = await client.text_document_code_lens_async(types.CodeLensParams(types.TextDocumentIdentifier(doc)))
        (lens,) = lenses
        assert lens.range.start.line == 3
        assert lens.command.command == "fuselens.showReport"
        assert "2 graphs" in lens.command.title and "1 recompile" in lens.command.title

        hover = await client.text_document_hover_async(
            types.HoverParams(types.TextDocumentIdentifier(doc), types.Position(line=5, character=8))
        )
        assert "compiled `scale`" in hover.contents.value and "0/1" in hover.contents.value
        outside = await client.text_document_hover_async(
            types.HoverParams(types.TextDocumentIdentifier(doc), types.Position(line=0, character=0))
        )
        assert outside is None

        # work-done progress was reported and ended
        (reports,) = client.progress_reports.values()
        assert reports[0].kind == "begin" and reports[-1].kind == "end"

        # second save with unchanged contents: answered from the cache
        summary = await command(client, "fuselens.analyze", doc)
        assert summary["cached"] is True and summary["recompiles"] == 1

        info = await command(client, "fuselens.serverInfo")
        assert info["torch_imported"] is False
        with open(f"/proc/{info['pid']}/maps") as f:
            assert "libtorch" not in f.read(), "the server process mapped torch's libraries"


async def test_graph_breaks_item_print_and_branch_each_get_a_fix_in_utf8_positions(ws):
    path = ws / "breaks.py"
    text = path.read_text()
    lines = text.split("\n")
    async with session(ws, encodings=["utf-8", "utf-16"]) as client:
        assert client.init_result.capabilities.position_encoding == "utf-8"
        doc = open_file(client, path)
        save_file(client, path)
        breaks = await wait_until(lambda: len(diagnostics(client, doc, "graph-break")) >= 3 and diagnostics(client, doc, "graph-break"), 90)
        by_line = {d.range.start.line: d for d in breaks}
        item, printed, branch = by_line[5], by_line[12], by_line[18]

        # user stack as related information; the registry page as code description
        assert any(r.location.uri == doc and r.location.range.start.line == 23 for r in item.related_information)
        assert item.code_description.href.endswith("gb0124.html")
        # columns in UTF-8 bytes: the print line holds multi-byte characters
        assert printed.range.end.character == len(lines[12].encode("utf-8"))

        async def fixed_by(diag, needle):
            actions = await code_actions(client, doc, diag)
            chosen = [a for a in actions if needle in a.title]
            assert chosen, [a.title for a in actions]
            out = _apply(text, chosen[0], doc, "utf-8")
            ast.parse(out)
            return out

        out = await fixed_by(item, "capture_scalar_outputs")
        assert "import torch\ntorch._dynamo.config.capture_scalar_outputs = True\n" in out
        out = await fixed_by(printed, "Remove the print")
        assert "tracing" not in out and "    y = x.sin()\n    return y.cos()" in out
        out = await fixed_by(printed, "reorderable_logging_functions")
        assert "torch._dynamo.config.reorderable_logging_functions.add(print)" in out
        out = await fixed_by(branch, "torch.cond")
        assert "return torch.cond(x.sum() > 0, pick_true, pick_false, (x,))" in out
        assert "torch.where" in branch.message  # the documented hint is in the message too


async def test_fusion_results_show_fused_lines_blocked_pairs_and_inlay_kernel_names(ws):
    path = ws / "fusion_replay.py"
    text = path.read_text()
    lines = text.split("\n")
    line = {m: next(i for i, l in enumerate(lines) if l.endswith(f"# {m}")) for m in "ABCD"}
    async with session(ws, init={"trusted": True, "inlayHints": True}) as client:
        doc = open_file(client, path)
        save_file(client, path)
        await wait_until(lambda: diagnostics(client, doc, "fusion-blocked"), 90)
        fused = diagnostics(client, doc, "fused")
        fused_lines = {d.range.start.line: d for d in fused}
        assert {line["A"], line["B"], line["D"]} <= set(fused_lines)
        assert fused_lines[line["A"]].severity == types.DiagnosticSeverity.Hint
        assert "cpp_fused_add_mul_0" in fused_lines[line["A"]].message and "mul, add" in fused_lines[line["A"]].message
        # the Inductor kernel's ops are read off its name
        assert "relu, sin" in fused_lines[line["D"]].message
        assert line["C"] not in fused_lines  # an extern call fused nothing

        blocked = {d.range.start.line: d for d in diagnostics(client, doc, "fusion-blocked")}
        assert blocked[line["B"]].severity == types.DiagnosticSeverity.Information
        assert "library call" in blocked[line["B"]].message
        assert await code_actions(client, doc, blocked[line["B"]]) == []  # no option, no mechanical change
        (action,) = await code_actions(client, doc, blocked[line["C"]])
        out = _apply(text, action, doc)
        ast.parse(out)
        assert "@torch.compile(backend=\"eager\", options={'max_fusion_size': 128})" in out

        hints = await client.text_document_inlay_hint_async(
            types.InlayHintParams(
                text_document=types.TextDocumentIdentifier(doc),
                range=types.Range(types.Position(0, 0), types.Position(len(lines), 0)),
            )
        )
        labels = {h.position.line: h.label for h in hints}
        assert "cpp_fused_add_mul_0" in labels[line["A"]]
        assert hints[0].position.character == len(lines[hints[0].position.line].rstrip())

        hover = await client.text_document_hover_async(
            types.HoverParams(types.TextDocumentIdentifier(doc), types.Position(line=line["A"], character=6))
        )
        assert "cpp_fused_add_mul_0" in hover.contents.value and "12.5 µs" in hover.contents.value
        lenses = await client.text_document_code_lens_async(types.CodeLensParams(types.TextDocumentIdentifier(doc)))
        commands = [l.command.command for l in lenses]
        assert commands == ["fuselens.showReport", "fuselens.showKernelSource"]
        source = await command(client, "fuselens.kernelSource", doc, "cpp_fused_add_mul_0")
        assert source["language"] == "cpp" and "cpp_fused_add_mul_0" in source["source"]
        written = await command(client, "fuselens.writeReport", doc)
        assert written["path"].endswith((".html", ".json"))
        with open(written["path"], encoding="utf-8") as f:
            assert "cpp_fused_add_mul_0" in f.read()


async def test_pull_client_gets_diagnostics_by_pull_and_never_by_push(ws):
    path = ws / "recompile.py"
    async with session(ws, pull=True) as client:
        assert client.init_result.capabilities.diagnostic_provider is not None
        doc = open_file(client, path)
        summary = await command(client, "fuselens.analyze", doc)
        assert summary["status"] == "ok" and summary["recompiles"] == 1
        await wait_until(lambda: client.diagnostic_refresh_count > 0, 10)
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(doc))
        )
        assert [d.code for d in report.items] == ["recompile"]
        again = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(doc), previous_result_id=report.result_id)
        )
        assert again.kind == "unchanged"
        assert client.diagnostics == {}, "pushed diagnostics to a pull client"


async def test_client_with_pull_but_no_refresh_like_neovim_gets_pushed_diagnostics_after_save(ws):
    path = ws / "recompile.py"
    async with session(ws, pull=True, refresh=False) as client:
        assert client.init_result.capabilities.diagnostic_provider is None
        doc = open_file(client, path)
        save_file(client, path)
        (diag,) = await wait_until(lambda: diagnostics(client, doc, "recompile"), 90)
        assert diag.range.start.line == 3
        assert (await command(client, "fuselens.serverInfo"))["pull_diagnostics"] is False
        assert client.diagnostic_refresh_count == 0


async def test_entry_from_pyproject_runs_train_py_with_args_and_reports_in_model_py(tmp_path):
    shutil.copytree(HERE / "entry_project", tmp_path / "proj")
    root = tmp_path / "proj"
    async with session(root) as client:
        model = open_file(client, root / "model.py")
        save_file(client, root / "model.py")
        (diag,) = await wait_until(lambda: diagnostics(client, model, "recompile"), 90)
        assert diag.range.start.line == 3 and "step" in diag.message
        assert diagnostics(client, uri(root / "train.py"), "error") == []  # --steps reached argparse
        (action,) = [a for a in await code_actions(client, model, diag) if "dynamic=True" in a.title]
        out = _apply((root / "model.py").read_text(), action, model)
        ast.parse(out)
        assert "@torch.compile(dynamic=True)" in out


async def test_analysis_started_and_finished_notifications_carry_the_run_counts(ws):
    path = ws / "recompile.py"
    async with session(ws) as client:
        heard: list[tuple[str, dict]] = []
        for method in ("fuselens/analysisStarted", "fuselens/analysisFinished"):
            client.feature(method)(lambda params, method=method: heard.append((method, _as_dict(params))))
        doc = open_file(client, path)
        summary = await command(client, "fuselens.analyze", doc)
        finished = await wait_until(lambda: [p for m, p in heard if m.endswith("Finished")], 10)
        assert heard[0] == ("fuselens/analysisStarted", {"uri": doc})
        assert finished == [{"uri": doc, "version": 1, "status": "ok", "cached": False, "graphBreaks": 0,
                             "recompiles": summary["recompiles"], "errors": 0, "seconds": summary["wall_s"]}]
        assert summary["recompiles"] == 1

        await command(client, "fuselens.analyze", doc)  # answered from the cache: no run starts
        await wait_until(lambda: len(heard) == 3, 10)
        assert heard[2][0] == "fuselens/analysisFinished" and heard[2][1]["cached"] is True


async def test_a_cancelled_run_is_announced_finished_without_counts(tmp_path):
    program = tmp_path / "slow.py"
    program.write_text("import time\ntime.sleep(300)\n")
    async with session(tmp_path) as client:
        finished: list[dict] = []
        client.feature("fuselens/analysisFinished")(lambda params: finished.append(_as_dict(params)))
        doc = open_file(client, program)
        save_file(client, program)
        await wait_until(lambda: client.progress_reports, 30)  # the run is under way
        assert (await command(client, "fuselens.cancel", doc)) == {"cancelled": True}
        (params,) = await wait_until(lambda: finished, 10)
        assert params == {"uri": doc, "version": 1, "status": "cancelled", "cached": False}


async def test_a_command_without_its_arguments_is_refused_as_invalid_params(ws):
    async with session(ws) as client:
        with pytest.raises(Exception, match="Invalid Params: Expected 2 arguments, got 1"):
            await command(client, "fuselens.kernelSource", uri(ws / "recompile.py"))
        with pytest.raises(Exception, match="Invalid Params: Expected .* got 0"):
            await command(client, "fuselens.analyze")
        assert (await command(client, "fuselens.serverInfo"))["pid"] > 0  # and the server goes on


def _as_dict(params) -> dict:
    """Params of a method lsprotocol does not know arrive as a named tuple."""
    return params if isinstance(params, dict) else params._asdict()
