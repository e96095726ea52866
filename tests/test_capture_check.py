"""What keeps a graph from CUDA-graph capture (compiler/runtime/capture_check.py), and the
finding the backend gives for it.

CI has no GPU: the graphs are real AOTAutograd graphs traced on the CPU, checked for the
CPU as the device they run on (the check is the same for any device), or traced on fake
CUDA tensors. The capture itself runs in tests/test_gpu_lowering.py on the GPU machine.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from fuselens.compiler import entry, options as options_mod
from fuselens.compiler.runtime.capture_check import capture_blocker
from fuselens.events import SourceLocation


def _aot_forward(fn: Any, *args: Any) -> tuple[torch.fx.GraphModule, list]:
    """The forward graph AOTAutograd hands a backend for `fn(*args)`, with its inputs."""
    from torch._dynamo.backends.common import aot_autograd

    got: list = []

    def keep(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=aot_autograd(fw_compiler=keep), fullgraph=True)(*args)
    return got[0]


def test_a_graph_of_device_work_alone_can_be_captured() -> None:
    gm, ins = _aot_forward(lambda x, w: torch.relu(x @ w).sum(-1) * 2, torch.randn(8, 4), torch.randn(4, 4))
    assert capture_blocker(gm, ins, device_type="cpu") is None


def test_a_value_read_on_the_host_blocks_capture_at_the_users_line() -> None:
    def first_n(x: torch.Tensor) -> torch.Tensor:
        n = x.argmax().item()  # the line the finding points at
        return torch.ones(n) * 2

    line = inspect.getsourcelines(first_n)[1] + 1
    old = torch._dynamo.config.capture_scalar_outputs
    torch._dynamo.config.capture_scalar_outputs = True
    try:
        gm, ins = _aot_forward(first_n, torch.randn(8))
    finally:
        torch._dynamo.config.capture_scalar_outputs = old
    blocker = capture_blocker(gm, ins, device_type="cpu")
    assert blocker is not None and "aten._local_scalar_dense" in blocker.reason and "host" in blocker.reason
    assert f"line {line}" in blocker.stack_trace and "test_capture_check.py" in blocker.stack_trace


def test_a_size_set_by_the_data_blocks_capture() -> None:
    gm = make_fx(lambda x, n: torch.repeat_interleave(x, n), tracing_mode="symbolic")(
        torch.randn(4), torch.tensor([1, 2, 1, 0]))
    blocker = capture_blocker(gm, [], device_type="cpu")
    assert blocker is not None and "repeat_interleave" in blocker.reason and "size depends on the data" in blocker.reason


def test_work_on_another_device_blocks_capture_but_a_zero_dim_literal_does_not() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(4, device="cuda")
    on_cpu = make_fx(lambda t: t + torch.arange(4).float().to(t.device), tracing_mode="fake")(x)
    literal = make_fx(lambda t: t * torch.scalar_tensor(3.0).to(t.device), tracing_mode="fake")(x)
    blocker = capture_blocker(on_cpu, [x])
    assert blocker is not None and "aten.arange computes on the cpu" in blocker.reason
    assert capture_blocker(literal, [x]) is None


def test_cuda_graphs_off_for_a_graph_that_reads_a_cpu_tensor_with_a_finding() -> None:
    """A compiled Adam with `capturable=False` keeps its step count on the CPU: captured,
    every replay would apply the first step's bias correction. The graph runs with plain
    launches, and the finding names the input."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        p = torch.empty(16, device="cuda")
    step = torch.tensor(3.0)
    gm = make_fx(lambda p, step: p * (1 - 0.9 ** step.to(p.device)), tracing_mode="fake")(p, step)
    where = SourceLocation(file="train.py", line=12, function="step")
    ident = entry.GraphIdentity("0/0:aot_inference", "0/0", "aot_inference", "step", where)
    opts = options_mod.resolve({"cuda_graphs": True})
    kept, findings = entry._cuda_graphs_for(gm, [p, step], opts, ident)
    clean, none = entry._cuda_graphs_for(gm, [p, p], opts, ident)
    assert not kept.cuda_graphs and clean.cuda_graphs and none == []
    (finding,) = findings
    assert finding.kind == "fallback" and "0/0:aot_inference runs without CUDA graphs" in finding.message
    assert "input 1 of the graph ([], float32) is a cpu tensor" in finding.message
    assert finding.location == where  # an input has no line of its own: the compiled function's
