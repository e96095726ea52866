"""AOTAutograd's graph printouts during a fuselens training compile
(compiler/aot_printouts.py): skipped while no logger reads them, printed when one does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx

import fuselens.compiler
from fuselens.compiler import aot_printouts


def _printouts_of_a_training_compile(monkeypatch: pytest.MonkeyPatch) -> int:
    printed = [0]
    real = torch.fx.GraphModule.print_readable

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        printed[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.GraphModule, "print_readable", counting)
    fuselens.compiler.register()
    torch._dynamo.reset()
    w = torch.randn(8, 8, requires_grad=True)
    torch.compile(lambda x: (x @ w).tanh().sum(), backend="fuselens")(torch.randn(4, 8)).backward()
    assert w.grad is not None
    return printed[0]


def test_a_training_compile_prints_no_graph_that_no_logger_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._functorch._aot_autograd import graph_compile

    before = (graph_compile._log_joint_graph, graph_compile._log_fw_bw_graphs)
    assert not aot_printouts.someone_reads()
    assert _printouts_of_a_training_compile(monkeypatch) == 0
    # AOTAutograd's own printing steps are back once the compile is done
    assert (graph_compile._log_joint_graph, graph_compile._log_fw_bw_graphs) == before


def test_with_the_aot_graph_loggers_on_the_joint_forward_and_backward_graphs_are_printed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch._logging.set_logs(aot_graphs=True, aot_joint_graph=True)
    try:
        assert aot_printouts.someone_reads()
        assert _printouts_of_a_training_compile(monkeypatch) >= 3
    finally:
        torch._logging.set_logs()


TRAINING_STEP = """
import torch
import fuselens.compiler
fuselens.compiler.register()
w = torch.randn(8, 8, requires_grad=True)
torch.compile(lambda x: (x @ w).tanh().sum(), backend="fuselens")(torch.randn(4, 8)).backward()
"""


def test_under_torch_trace_the_structured_trace_holds_the_joint_graph(tmp_path: Any) -> None:
    """tlparse users keep AOTAutograd's graphs: TORCH_TRACE makes the trace a reader."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCH_TRACE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", TRAINING_STEP], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    trace = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "aot_joint_graph" in trace and "aot_backward_graph" in trace
