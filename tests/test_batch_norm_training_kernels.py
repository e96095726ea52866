"""A training BatchNorm's work per layer, as the host pays for it: its running statistics
updated in the kernel that computes the batch statistics (no per-channel buffers and no
kernel of their own), and the views the backward saves re-created from their base in one
step each (a squeeze and three unsqueezes were four re-created views a layer).
DenseNet-121's training step on an H200 is host-bound; these were 116 of its 1,863 fresh
tensors and 472 of its 939 re-created views a step. The merge into a reduction's kernel
happens only where it frees a result of that kernel (not for cross-entropy's label pick)."""

from __future__ import annotations

import copy
import re

import torch
import torch.nn as nn

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from compiled_helpers import cpp_kernels, fresh_dynamo  # noqa: F401  (fresh_dynamo: autouse fixture)
from fuselens import sink
from fuselens.events import FusionDecision
from fuselens.compiler.runtime import wrapper_codegen


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU())
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return net.train()


def _train_step(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = net(x)
    out.square().mean().backward()
    return out


def test_running_statistics_update_in_the_batch_statistics_kernel_and_match_eager() -> None:
    x = torch.randn(4, 3, 12, 12)
    eager, ours = _net(), _net()
    want = _train_step(eager, x)
    compiled = torch.compile(ours, backend="fuselens")
    with sink.collect() as events, wrapper_codegen.recorded_sources() as sources:
        got = _train_step(compiled, x)
    torch.testing.assert_close(got, want)
    for (name, a), b in zip(eager.named_buffers(), ours.buffers()):
        torch.testing.assert_close(b, a, msg=name)
    for (name, a), b in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)

    forward = sources[0]
    # each layer's statistics kernel writes the new running mean and variance into the
    # module's buffers: one kernel a layer, and one that counts the batches of both
    kernels = [k.name for k in cpp_kernels(events) if ":aot_forward" in k.graph_id]
    assert len(kernels) == 3, kernels
    per_channel = re.findall(r"= _empty\w*\(\(8, \)", forward)
    assert not per_channel, forward
    joined = [e for e in events if isinstance(e, FusionDecision) and e.decision == "fused"
              and "as the reduction's epilogue" in e.reason]
    assert len(joined) >= 2  # one per layer at least: the running mean's and the variance's updates


def test_a_saved_view_of_a_view_is_recreated_from_its_base_in_one_step() -> None:
    x = torch.randn(4, 3, 12, 12)
    with wrapper_codegen.recorded_sources() as sources:
        _train_step(torch.compile(_net(), backend="fuselens"), x)
    forward = sources[0]
    views = re.findall(r"^\s+(\w+) = _reinterpret\((\w+),", forward, re.M)
    made = {v for v, _ in views}
    assert views
    assert not [(v, base) for v, base in views if base in made], forward  # no link re-created from another


def test_a_chain_of_views_through_the_interpreter_gives_the_same_tensor() -> None:
    """The interpreter (graphs the wrapper is not generated for) runs the collapsed view
    as a call: it must land on the same elements as the chain did."""
    from fuselens.compiler.runtime.plan import reinterpret_view

    base = torch.arange(60.0).view(3, 20)[1:]  # a storage offset of its own
    chained = base[:, 4:].unsqueeze(0).transpose(1, 2)[:, 2:]
    shift = chained.storage_offset() - base.storage_offset()
    same = reinterpret_view(base, tuple(chained.shape), chained.stride(), shift)
    assert same.data_ptr() == chained.data_ptr()
    torch.testing.assert_close(same, chained)


def test_cross_entropys_label_pick_stays_for_the_loss_sum_and_out_of_the_logsumexp_kernel() -> None:
    """The merge into a reduction's kernel is for work that frees a result of it: the
    running statistics' update reads the batch mean alone. Cross-entropy's pick of the
    label's logit reads the log-sum-exp and the row maximum, which the backward keeps
    anyway: merged, its result would be stored for the loss's sum, which otherwise
    computes it where it reads it."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    w = torch.randn(16, 50, requires_grad=True)
    x, y = torch.randn(64, 16), torch.randint(0, 50, (64,))

    def step(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(x @ w, y)

    with sink.collect() as events:
        loss = torch.compile(step, backend="fuselens")(x, w, y)
        loss.backward()
    torch.testing.assert_close(loss, step(x, w, y))
    assert not [e.nodes for e in events if isinstance(e, FusionDecision) and "reduction's epilogue" in e.reason]


def test_running_mean_update_joins_its_statistics_kernel_in_a_deep_network() -> None:
    """AOTAutograd puts every input mutation at the graph's end. The running variance's
    update freed a buffer and moved next to its statistics (early_outputs.py); the running
    mean's freed none and stayed: hundreds of steps from its layer, the scheduler would
    not fuse across that gap, and each layer kept a per-channel buffer alive to the end
    for a kernel there (DenseNet-121: 120 layers)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(24):
        layers += [nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.ReLU()]
    eager = nn.Sequential(*layers).train()
    ours = copy.deepcopy(eager)
    x = torch.randn(2, 4, 5, 5)
    want = _train_step(eager, x)
    with wrapper_codegen.recorded_sources() as sources:
        got = _train_step(torch.compile(ours, backend="fuselens"), x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # 24 normalizations of 50 values each
    for (name, a), b in zip(eager.named_buffers(), ours.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4, msg=name)
    forward = sources[0]
    assert len(re.findall(r"\n\s+\w+ = _empty\w*\(\(4, \)", forward)) == 0, forward
    assert "_into_input" not in forward
