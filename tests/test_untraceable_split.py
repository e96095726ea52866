"""A custom op whose registered backward reads a tensor's value in Python cannot be traced
by AOTAutograd. Dynamo answers a backend's failure with a graph break at the op, repeated
in every enclosing frame; fuselens instead compiles the graph around the op, which runs
eagerly between the compiled parts, and says so at the op's line. The op here is built
like Hugging Face transformers' grouped-matmul fallback for mixture-of-experts layers (up
to 5.17), which made a Mixtral training step 12 graphs."""

from __future__ import annotations

import inspect

import torch

from compiled_helpers import fresh_dynamo  # noqa: F401 - fixture
from fuselens import sink
from fuselens.events import ErrorEntry


def _grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype)
    start = 0
    for i, end in enumerate(offs.tolist()):
        torch.mm(x[start:end], w[i], out=out[start:end])
        start = end
    return out


def _grouped_mm_fake(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[2])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _backward_reading_offsets(ctx, grad):
    x, w = ctx.saved_tensors
    gx, gw = torch.zeros_like(x), torch.zeros_like(w)
    start = 0
    for i, end in enumerate(ctx.offs.tolist()):  # a tensor's value, in Python: untraceable
        gx[start:end] = grad[start:end] @ w[i].T
        gw[i] = x[start:end].T @ grad[start:end]
        start = end
    return gx, gw, None


torch.library.custom_op("fuselens_test::grouped_mm_reading_offsets", _grouped_mm, mutates_args=(),
                        schema="(Tensor x, Tensor w, Tensor offs) -> Tensor")
torch.library.register_fake("fuselens_test::grouped_mm_reading_offsets", _grouped_mm_fake)
torch.library.register_autograd("fuselens_test::grouped_mm_reading_offsets", _backward_reading_offsets,
                                setup_context=_setup)


def _two_expert_layers(x, w1, w2, offs):
    h = torch.nn.functional.silu(torch.ops.fuselens_test.grouped_mm_reading_offsets(x * 2.0, w1, offs))
    y = torch.ops.fuselens_test.grouped_mm_reading_offsets(h + 1.0, w2, offs)
    return (y.tanh() * x).sum()


def _inputs():
    torch.manual_seed(0)
    x = torch.randn(12, 8, requires_grad=True)
    w1 = torch.randn(3, 8, 16, requires_grad=True)
    w2 = torch.randn(3, 16, 8, requires_grad=True)
    return x, w1, w2, torch.tensor([4, 9, 12])


def _grads(fn, x, w1, w2, offs):
    for t in (x, w1, w2):
        t.grad = None
    loss = fn(x, w1, w2, offs)
    loss.backward()
    return loss.detach(), [t.grad.clone() for t in (x, w1, w2)]


def test_a_custom_op_whose_backward_reads_a_tensor_value_keeps_the_step_one_graph_with_eager_gradients():
    args = _inputs()
    want_loss, want = _grads(_two_expert_layers, *args)
    torch._dynamo.utils.counters.clear()
    got_loss, got = _grads(torch.compile(_two_expert_layers, backend="fuselens"), *args)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]
    torch.testing.assert_close(got_loss, want_loss)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_without_the_split_dynamo_breaks_the_graph_at_that_op():
    """The same step under `aot_eager` (AOTAutograd and nothing else), which every backend
    that traces the backward shares: Dynamo breaks the graph at the op (here, in the
    function's own frame, it runs the whole function eagerly)."""
    torch._dynamo.utils.counters.clear()
    _grads(torch.compile(_two_expert_layers, backend="aot_eager"), *_inputs())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] != 1


def test_the_op_running_eagerly_is_reported_at_its_line_with_the_reason():
    with sink.collect() as events:
        _grads(torch.compile(_two_expert_layers, backend="fuselens"), *_inputs())
    said = [e for e in events if isinstance(e, ErrorEntry) and "grouped_mm_reading_offsets" in e.message]
    assert len(said) == 1, [e.message for e in events if isinstance(e, ErrorEntry)]
    e = said[0]
    assert e.kind == "fallback"
    assert "fuselens_test::grouped_mm_reading_offsets runs eagerly between compiled parts" in e.message
    assert "(2 calls)" in e.message and "3 parts" in e.message
    assert "cannot trace its backward" in e.message and "_backward_reading_offsets" in e.message
    lines, first = inspect.getsourcelines(_two_expert_layers)
    assert e.location is not None and e.location.file == __file__
    assert e.location.line == first + 1  # the first call's line


def test_without_gradients_the_op_is_traced_whole_and_nothing_is_split():
    x, w1, w2, offs = (t.detach() for t in _inputs())
    with sink.collect() as events:
        got = torch.compile(_two_expert_layers, backend="fuselens")(x, w1, w2, offs)
    torch.testing.assert_close(got, _two_expert_layers(x, w1, w2, offs))
    assert not [e for e in events if isinstance(e, ErrorEntry) and "runs eagerly between" in e.message]


def test_with_dynamic_sizes_the_split_graph_serves_a_new_batch_size_without_compiling_again():
    f = torch.compile(_two_expert_layers, backend="fuselens", dynamic=True)
    torch._dynamo.utils.counters.clear()
    for n in (12, 16):
        torch.manual_seed(0)
        x = torch.randn(n, 8, requires_grad=True)
        w1, w2 = torch.randn(3, 8, 16, requires_grad=True), torch.randn(3, 16, 8, requires_grad=True)
        offs = torch.tensor([4, 9, n])
        want_loss, want = _grads(_two_expert_layers, x, w1, w2, offs)
        got_loss, got = _grads(f, x, w1, w2, offs)
        torch.testing.assert_close(got_loss, want_loss)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_a_library_frame_under_a_directory_named_torch_is_the_users_location_not_torchs():
    """The GPU machine's environment lives in /opt/torch/.venv: the text "/torch/" made every
    frame there torch's, so a finding in transformers' code lost its location."""
    from fuselens.compiler.explain import location_from_stack

    venv = "/opt/torch/.venv/lib/python3.12/site-packages"
    stack = (f'  File "{venv}/transformers/integrations/moe.py", line 336, in _grouped_mm\n'
             "    return torch.ops.transformers.grouped_mm_fallback(x, w, offs=offs)\n"
             f'  File "{venv}/torch/_ops.py", line 1257, in __call__\n'
             "    return self._op(*args, **kwargs)\n")
    loc = location_from_stack(stack)
    assert loc is not None and (loc.file, loc.line) == (f"{venv}/transformers/integrations/moe.py", 336)
