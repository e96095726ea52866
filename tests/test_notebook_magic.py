"""`%%fuselens`: the IPython extension, in a real Jupyter kernel (jupyter_client
talking to ipykernel over ZMQ) and through its pure helpers.

Graph breaks use backend="eager" (an Inductor compile costs ~15 s here).
"""

from __future__ import annotations

import queue
from typing import Any

import pytest

# the extension itself imports IPython: where it is missing (the GPU machine), skip, not fail collection
pytest.importorskip("IPython")
jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from fuselens.events import ErrorEntry, GraphBreak, Report, RunInfo, SourceLocation  # noqa: E402
from fuselens.notebook_magic import NotebookReport, build_cell_program, relabel_report  # noqa: E402

CELL_TIMEOUT_S = 180


# -- pure helpers -------------------------------------------------------------
def test_history_skips_failed_fuselens_and_current_cells_and_keeps_cell_lines():
    history = [
        (1, "%load_ext fuselens"),
        (2, "import torch\ndef f(x):\n    return x.sin()"),
        (3, "1/0"),
        (4, "%%fuselens --backend eager\nf(1)"),
        (5, "   "),
        (6, "%%fuselens\nf(2)"),  # the current cell, already stored by IPython
    ]
    program = build_cell_program("f(2)", 6, history, failed=frozenset({3}))
    assert program.labels == ["In[1]", "In[2]", "In[6]"]
    assert program.sources[1].startswith("import torch")
    # A blank line stands in for the `%%fuselens` line: report line 2 is cell line 2.
    assert program.sources[-1] == "\nf(2)"


def test_no_history_runs_only_the_cell():
    program = build_cell_program("x = 1", 9, [(1, "import torch")], use_history=False)
    assert program.sources == ["\nx = 1"]
    assert program.labels == ["In[9]"]


def test_a_magic_named_like_fuselens_is_not_mistaken_for_a_fuselens_cell():
    program = build_cell_program("y", 3, [(1, "%%fuselensx\nprint(1)"), (2, "%%fuselens\nz")])
    assert program.labels == ["In[1]", "In[3]"]


def test_report_locations_and_tracebacks_point_at_in_cells():
    nb = "/tmp/fuselens-cell-abc/cell.ipynb"
    loc = SourceLocation(file=nb, line=4, function="f", cell=0)
    report = Report(
        run=RunInfo(target=nb, target_kind="notebook"),
        graph_breaks=[GraphBreak(location=loc, reason="print", user_stack=[SourceLocation(nb, 3, cell=1)])],
        errors=[ErrorEntry("exception", f"boom in {nb}#cell1", traceback=f'File "{nb}#cell1", line 3')],
    )
    relabel_report(report, nb, ["In[2]", "In[5]"])
    gb = report.graph_breaks[0]
    assert (gb.location.file, gb.location.cell, gb.location.line) == ("In[2]", None, 4)
    assert gb.user_stack[0].file == "In[5]"
    assert report.errors[0].traceback == 'File "In[5]", line 3'
    assert nb not in report.errors[0].message
    assert report.run.target == "In[5]"


def test_text_repr_lists_each_graph_break_with_its_cell():
    report = Report(
        run=RunInfo(target="In[7]"),
        graph_breaks=[GraphBreak(location=SourceLocation("In[7]", 3), reason="builtin print")],
    )
    text = repr(NotebookReport(report))
    assert "1 graph break" in text
    assert "graph break at In[7]:3: builtin print" in text


# -- a real kernel ------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A python3 ipykernel in a scratch folder, with the extension loaded."""
    from jupyter_client.manager import KernelManager

    cwd = tmp_path_factory.mktemp("kernel")
    # IPC sockets in the scratch folder: nothing listens on TCP.
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(cwd / "kernel-ipc"))
    km.start_kernel(cwd=str(cwd))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        outputs = execute(kc, "%load_ext fuselens")
        assert not errors(outputs), outputs
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc: Any, code: str) -> list[dict]:
    """Runs `code` like a notebook cell; returns its iopub output messages."""
    outputs: list[dict] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] in ("execute_result", "display_data", "error", "stream"):
            outputs.append(msg)

    try:
        kc.execute_interactive(code, timeout=CELL_TIMEOUT_S, output_hook=hook)
    except (TimeoutError, queue.Empty):  # pragma: no cover - shows what came so far
        pytest.fail(f"cell timed out after {CELL_TIMEOUT_S} s; outputs so far: {outputs}")
    return outputs


def errors(outputs: list[dict]) -> list[str]:
    return [f"{m['content']['ename']}: {m['content']['evalue']}" for m in outputs if m["msg_type"] == "error"]


def result_data(outputs: list[dict]) -> dict:
    results = [m["content"]["data"] for m in outputs if m["msg_type"] == "execute_result"]
    assert len(results) == 1, outputs
    return results[0]


def test_fuselens_cell_shows_graph_break_in_earlier_cell_inline(kernel):
    # A function defined in an earlier cell, and a failed cell that must not
    # stop the worker's replay of the history.
    assert not errors(execute(kernel, "import torch\n\ndef f(x):\n    y = x.sin()\n    print('side effect')\n    return y.cos()\n"))
    assert errors(execute(kernel, "1/0")) == ["ZeroDivisionError: division by zero"]
    outputs = execute(
        kernel,
        "%%fuselens --backend eager --max-calls 2 -o rep\n"
        "g = torch.compile(f)\n"
        "g(torch.randn(8))\n",
    )
    assert not errors(outputs), outputs
    data = result_data(outputs)
    text = data["text/plain"]
    html = data["text/html"]
    assert "graph break at In[" in text, text
    # The break is in f, the earlier cell, at line 5 (`print`).
    count = int(text.split("graph break at In[")[1].split("]")[0])
    assert f"In[{count}]:5" in text
    assert html.startswith('<iframe class="fuselens-report"')
    assert "Graph breaks" in html or "graph break" in html.lower()
    # The cell ran in the worker only: the kernel never called g...
    assert "side effect" not in "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    # ...and -o stored the Report for further use.
    stored = execute(kernel, "print(type(rep).__name__, len(rep.graph_breaks), rep.graph_breaks[0].location.line)")
    assert "Report 1 5" in "".join(m["content"].get("text", "") for m in stored)


def test_no_history_cell_cannot_see_earlier_definitions(kernel):
    execute(kernel, "def h(x):\n    return x + 1\n")
    outputs = execute(kernel, "%%fuselens --no-history\nh(1)\n")
    assert not errors(outputs), outputs
    text = result_data(outputs)["text/plain"]
    assert "exception" in text and "NameError" in text, text
    assert ":2:" in text or ":2 " in text or "]:2" in text, text


def test_unknown_option_is_a_usage_error_not_a_run(kernel):
    outputs = execute(kernel, "%%fuselens --bogus\nx = 1\n")
    stderr = "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
    assert "UsageError: unrecognized arguments: --bogus" in stderr, outputs
    assert not [m for m in outputs if m["msg_type"] == "execute_result"], outputs
