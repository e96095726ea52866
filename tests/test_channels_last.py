"""Channels-last convolutions (compiler/layout_passes.py), in inference and training graphs.

The rule is the GPU's (cuDNN computes 16-bit convolutions in NHWC) and the C++ target's
in inference (oneDNN too); here the C++ target runs it on CPU graphs,
to check what the GPU run relies on: the forward reports the strides of its saved
activations, AOTAutograd compiles the backward for them, the backward converts its
convolution gradients, and every gradient and output matches eager in eager's layout.
The H100 run of `benchmarks.models` checks the same on ResNet-50.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import fuselens.compiler  # noqa: F401
from fuselens import sink
from fuselens.compiler import layout_passes
from fuselens.compiler.entry import decompositions
from fuselens.compiler.targets.cpp import CppTarget
from fuselens.events import FusionDecision, Kernel

aten = torch.ops.aten


class _Block(nn.Module):
    """A ResNet basic block with a pooled stem and a linear head: convolutions,
    training BatchNorm, max-pooling, a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(8)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn0(self.stem(x))), 3, 2, 1)
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)) + x)
        return self.fc(h.mean((2, 3)))


@pytest.fixture
def backward_convolutions(monkeypatch: pytest.MonkeyPatch) -> list:
    """Runs the Triton target's rule on CPU tensors; returns the (gradient, input)
    strides each backward convolution was compiled with."""
    own = CppTarget.graph_rewrites
    seen: list = []

    def rewrites(self, gm, example_inputs, stage):
        kept = layout_passes.forward_user_outputs() if stage == "aot_forward" else None
        done = own(self, gm, example_inputs, stage) + layout_passes.channels_last_convolutions(
            gm, require_cuda=False, kept_outputs=kept)
        seen.extend((n.args[0].meta["val"], n.args[1].meta["val"]) for n in gm.graph.nodes
                    if n.target is torch.ops.aten.convolution_backward.default)
        if stage == "aot_backward":
            out = next(n for n in gm.graph.nodes if n.op == "output")
            seen.extend(("gradient", n.meta["val"]) for n in out.all_input_nodes)
        return done

    monkeypatch.setattr(CppTarget, "graph_rewrites", rewrites)
    return seen


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    F.cross_entropy(out, y).backward()
    return out


def _twin_blocks() -> tuple[_Block, _Block, torch.Tensor, torch.Tensor]:
    """Two blocks of the same weights (eager's and the one to compile), an input and
    labels, after a Dynamo reset."""
    torch.manual_seed(0)
    ref = _Block()
    model = _Block()
    model.load_state_dict(ref.state_dict())
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,))
    torch._dynamo.reset()
    return ref, model, x, y


def test_training_step_with_channels_last_convolutions_matches_eager_gradients(backward_convolutions: list) -> None:
    ref, model, x, y = _twin_blocks()
    with sink.collect() as events:
        compiled = torch.compile(model, backend="fuselens")
        for _ in range(2):  # the second step runs the compiled graphs again, with the running stats they wrote
            model.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            out, want = _step(compiled, x, y), _step(ref, x, y)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
                assert p.grad.is_contiguous(), name  # gradients in the parameters' layout, not NHWC
        for a, b in zip(model.buffers(), ref.buffers()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
    rewritten = {e.nodes[0] for e in events if isinstance(e, FusionDecision) and e.rule == "channels-last"}
    assert {"convolution", "convolution_1", "convolution_2"} <= rewritten
    # saved activations came in NHWC, and gradients flow NHWC from one convolution to the next
    gradients = [v for what, v in backward_convolutions if what == "gradient"]
    assert gradients and all(v.is_contiguous() for v in gradients)  # restored in the graph, not by autograd
    convolutions = [c for c in backward_convolutions if c[0] != "gradient"]
    assert len(convolutions) == 3
    for grad, inp in convolutions:
        assert grad.is_contiguous(memory_format=torch.channels_last)
        assert inp.is_contiguous(memory_format=torch.channels_last)


class _FlatteningNet(nn.Module):
    """VGG's head: the convolutions' output flattened, channels and pixels in one, for a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc(h.view(h.shape[0], -1))


class _SqueezeExcitation(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 8), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x))
        w = torch.sigmoid(self.fc(h.mean((2, 3)))).view(h.shape[0], h.shape[1], 1, 1)
        return self.head((h * w).mean((2, 3)))


class _ChannelShuffle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.conv2, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x))
        b, c, hh, ww = h.shape
        h = h.view(b, 2, c // 2, hh, ww).transpose(1, 2).contiguous().view(b, c, hh, ww)
        return self.head(F.relu(self.conv2(h)).mean((2, 3)))


class _PixelShuffle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.conv2, self.head = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1), nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv2(F.pixel_shuffle(F.relu(self.conv(x)), 2)).mean((2, 3)))


class _NonLocal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x))
        b, c, hh, ww = h.shape
        f = h.view(b, c, hh * ww)
        y = (f @ torch.softmax(f.transpose(1, 2) @ f, -1)).view(b, c, hh, ww) + h
        return self.head(y.mean((2, 3)))


@pytest.mark.parametrize("net", [_FlatteningNet, _SqueezeExcitation, _ChannelShuffle, _PixelShuffle, _NonLocal])
def test_cnn_reshapes_around_channels_last_convolutions_train_as_eager_with_no_fallback(
        backward_convolutions: list, net: type) -> None:
    """Views and reshapes CNNs make of their activations (a flatten of channels and pixels
    for a linear head, a squeeze-excitation's gate, a channel shuffle, a pixel shuffle, a
    non-local block's pixels as a sequence), with the activations channels-last: compiled
    whole, gradients as eager's. No view flattens C, H and W of NHWC activations together:
    the pass views a contiguous copy, as eager's reshape would. Before, such a forward
    failed to compile and ran eagerly (VGG, LeNet: every CNN that flattens with a view)."""
    from fuselens.events import ErrorEntry

    events = _one_step_as_eager(net)
    assert [e.message for e in events if isinstance(e, ErrorEntry)] == []
    assert any(what != "gradient" for what, _ in backward_convolutions)  # the rule ran on this graph


def _one_step_as_eager(net: type) -> list:
    """One training step of a compiled copy of `net` and of eager's on 8x8 images: the
    outputs and every gradient compared; returns the compiled step's events."""
    torch.manual_seed(0)
    ref, model = net(), net()
    model.load_state_dict(ref.state_dict())
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    torch._dynamo.reset()
    with sink.collect() as events:
        out, want = _step(torch.compile(model, backend="fuselens"), x, y), _step(ref, x, y)
    torch._dynamo.reset()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    return events


def test_cpu_inference_of_a_cnn_with_a_flatten_head_compiles_whole() -> None:
    """The C++ target's own inference rule (no fixture): nn.Flatten after a convolution fell
    back to eager, for every such CNN on the CPU."""
    from fuselens.events import ErrorEntry

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(8 * 4 * 4, 5)).eval()
    x = torch.randn(4, 3, 8, 8)
    torch._dynamo.reset()
    with torch.no_grad(), sink.collect() as events:
        out = torch.compile(m, backend="fuselens")(x)
        want = m(x)
    torch._dynamo.reset()
    assert [e.message for e in events if isinstance(e, ErrorEntry)] == []
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    assert any(isinstance(e, FusionDecision) and e.rule == "channels-last" for e in events)


def test_backward_placeholders_take_the_strides_the_forward_reported() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        x = torch.empty(2, 4, 5, 5)
    gm = make_fx(lambda x: (x * 2).sum((2, 3)), tracing_mode="fake")(x)
    with mode:
        nhwc = torch.empty(2, 4, 5, 5).to(memory_format=torch.channels_last)
    assert layout_passes.adopt_input_layouts(gm, [nhwc])
    mul = next(n for n in gm.graph.nodes if n.op == "call_function" and "mul" in str(n.target))
    assert mul.meta["val"].is_contiguous(memory_format=torch.channels_last)  # propagated from the input
    assert not layout_passes.adopt_input_layouts(gm, [nhwc])  # already as given


def test_convolutions_run_channels_last_and_outputs_keep_eager_layout():
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = torch.randn(2, 8, 16, 16, generator=g), torch.randn(16, 8, 3, 3, generator=g), torch.randn(4, 16, 1, 1, generator=g)

    def fn(x, w1, w2):
        h = torch.relu(F.conv2d(x, w1, padding=1))
        return F.conv2d(h * 2 + 1, w2), h.mean((2, 3))

    gm = make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(x, w1, w2)
    done = layout_passes.channels_last_convolutions(gm, require_cuda=False)
    assert {r.rule for r in done} == {"channels-last"}
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert all(n.meta["val"].is_contiguous(memory_format=torch.channels_last) for n in convs)
    outs, refs = gm(x, w1, w2), fn(x, w1, w2)
    for o, r in zip(outs, refs):
        assert o.stride() == r.stride()
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)


def test_an_operand_already_channels_last_is_not_copied_again():
    """The second convolution's operand is computed from the first's NHWC result, so it
    comes out NHWC: a conversion inserted for it would store the same values twice."""
    g = torch.Generator().manual_seed(0)
    x, w1, w2 = torch.randn(2, 8, 16, 16, generator=g), torch.randn(8, 8, 3, 3, generator=g), torch.randn(4, 8, 1, 1, generator=g)

    def fn(x, w1, w2):
        h = F.conv2d(x, w1, padding=1)
        return F.conv2d(torch.relu(h + x), w2)

    gm = make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(x, w1, w2)
    layout_passes.channels_last_convolutions(gm, require_cuda=False)
    clones = [n for n in gm.graph.nodes if n.target is aten.clone.default]
    # the user's input and the 3x3 weight are converted in, the result back to eager's
    # layout; relu(h + x) is NHWC already (and a 1x1 weight is both layouts)
    assert sorted(str(n.args[0]) for n in clones) == ["convolution_1", "w1_1", "x_1"]
    torch.testing.assert_close(gm(x, w1, w2), fn(x, w1, w2), rtol=1e-4, atol=1e-4)


def test_cpu_inference_convolutions_run_channels_last_and_kernels_loop_channels_innermost():
    """On the C++ target an inference graph's convolutions take NHWC operands (oneDNN's
    own layout), and the pointwise kernel between two of them loops with the channels
    innermost: its simd loop walks the NHWC buffers contiguously, not 32 floats apart."""
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(16, 32, 3, padding=1), nn.Conv2d(32, 8, 1)

    def fn(x):
        return conv2(F.hardswish(conv1(x)))

    x = torch.randn(2, 16, 12, 12)
    torch._dynamo.reset()
    with torch.no_grad(), sink.collect() as events:
        out = torch.compile(fn, backend="fuselens")(x)
        want = fn(x)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert out.stride() == want.stride()
    assert "channels-last" in {e.rule for e in events if isinstance(e, FusionDecision)}
    (act,) = [k for k in events if isinstance(k, Kernel) and k.kind == "cpp" and "clamp" in k.name]
    lines = [ln.strip() for ln in act.source.splitlines()]
    simd = lines.index("#pragma omp simd")
    assert lines[simd + 1].startswith("for (int64_t g1 = 0; g1 < 32; g1++)"), act.source


class _Gated(nn.Module):
    """A gated convolution: its output split in two (an op whose value is a list)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.conv(x).chunk(2, dim=1)
        return self.fc((a * torch.sigmoid(b)).mean((2, 3)))


@pytest.mark.parametrize("make", [_Block, _Gated], ids=["resnet_block", "gated_conv"])
def test_values_propagated_from_the_changed_nodes_alone_equal_a_whole_graph_propagation(
        backward_convolutions: list, monkeypatch: pytest.MonkeyPatch, make: type) -> None:
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    partial = layout_passes._propagate_fake_values
    runs = {"partial": 0, "whole": 0}
    checked: list[int] = []
    counting = {"now": "partial"}
    run_node = FakeTensorProp.run_node

    def counted(self, n):
        runs[counting["now"]] += 1
        return run_node(self, n)

    def both(gm, mode, changed=None):
        partial(gm, mode, changed)
        if changed is None:
            return
        got = {n: n.meta.get("val") for n in gm.graph.nodes if n.op != "output"}
        counting["now"] = "whole"
        partial(gm, mode, None)
        counting["now"] = "partial"
        for n, v in got.items():
            assert layout_passes._same_fake(v, n.meta.get("val")), n.format_node()
        checked.append(len(got))

    monkeypatch.setattr(FakeTensorProp, "run_node", counted)
    monkeypatch.setattr(layout_passes, "_propagate_fake_values", both)
    torch.manual_seed(0)
    model = make()
    torch._dynamo.reset()
    _step(torch.compile(model, backend="fuselens", options={"fallback_on_error": False}),
          torch.randn(4, 3, 16, 16), torch.randint(0, 5, (4,)))
    torch._dynamo.reset()
    assert len(checked) >= 2  # the forward's conversions, the backward's saved activations and conversions
    assert runs["partial"] < runs["whole"]


def _grouped_graph(groups: int, channels: int = 16):
    """conv(x) -> relu -> a grouped 3x3 convolution of `groups` groups -> a 1x1 one."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, channels, 8, 8, generator=g)
    w1 = torch.randn(channels, channels, 1, 1, generator=g)
    wg = torch.randn(channels, channels // groups, 3, 3, generator=g)
    w2 = torch.randn(8, channels, 1, 1, generator=g)

    def fn(x, w1, wg, w2):
        h = torch.relu(F.conv2d(x, w1))
        return F.conv2d(torch.relu(F.conv2d(h, wg, padding=1, groups=groups)), w2)

    gm = make_fx(fn, decomposition_table=decompositions(), tracing_mode="fake")(x, w1, wg, w2)
    return gm, fn, (x, w1, wg, w2)


def test_cudnn_training_graph_with_grouped_convolution_keeps_eager_layout_and_says_why():
    """cuDNN transforms the tensors of a grouped convolution reading several channels per
    group at every NHWC call: a training graph with one keeps NCHW (Inductor's rule),
    and the decision is reported with the convolution that caused it."""
    gm, fn, args = _grouped_graph(groups=2)
    done = layout_passes.channels_last_convolutions(gm, require_cuda=False, cudnn=True, stage="aot_forward",
                                                   kept_outputs=1)
    assert len(done) == 1 and done[0].rule == "channels-last" and not done[0].applied
    assert "2 groups reading 8 channels each" in done[0].detail
    assert not [n for n in gm.graph.nodes if n.target is aten.clone.default]
    torch.testing.assert_close(gm(*args), fn(*args), rtol=1e-4, atol=1e-4)


def test_cudnn_depthwise_convolution_still_runs_channels_last_in_training():
    """A depthwise convolution (one channel per group: MobileNet, EfficientNet, ConvNeXt)
    is faster in NHWC, so it does not hold the graph back."""
    gm, fn, args = _grouped_graph(groups=16)
    done = layout_passes.channels_last_convolutions(gm, require_cuda=False, cudnn=True, stage="aot_forward",
                                                   kept_outputs=1)
    assert done and all(r.applied for r in done)
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert all(n.meta["val"].is_contiguous(memory_format=torch.channels_last) for n in convs)
    torch.testing.assert_close(gm(*args), fn(*args), rtol=1e-4, atol=1e-4)


def test_cudnn_inference_weighs_grouped_convolution_flops_against_the_rest():
    """Inference converts unless the grouped convolutions' share of the flops makes NHWC
    slower by Inductor's measured costs: here the grouped 3x3 dominates a graph of 1x1
    convolutions, so it declines; with small groups of the same graph in the minority
    (wide 3x3 convolutions around them) it converts."""
    gm, _, _ = _grouped_graph(groups=2)
    declined = layout_passes.cudnn_declines(layout_passes._convolutions(gm), "aot_inference")
    assert declined is not None and not declined.applied and "NHWC would be" in declined.detail

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 128, 8, 8, generator=g), torch.randn(128, 128, 3, 3, generator=g)
    wg = torch.randn(128, 64, 1, 1, generator=g)

    def mostly_dense(x, w, wg):
        return F.conv2d(F.conv2d(F.conv2d(x, w, padding=1), wg, groups=2), w, padding=1)

    gm = make_fx(mostly_dense, decomposition_table=decompositions(), tracing_mode="fake")(x, w, wg)
    assert layout_passes.cudnn_declines(layout_passes._convolutions(gm), "aot_inference") is None


def test_a_declined_rewrite_is_reported_as_not_fused_with_its_reason():
    from fuselens.compiler.entry import _rewrite_decisions
    from fuselens.compiler.graph_passes import GraphRewrite

    class _NoGroups:
        groups: list = []

    events = _rewrite_decisions([GraphRewrite("channels-last", "convolution_1", "kept NCHW: why", applied=False),
                                 GraphRewrite("pad-matmul", "mm", "padded")], [], _NoGroups(), "0/0")
    assert [(e.decision, e.rule, e.reason) for e in events] == [
        ("not_fused", "channels-last", "kept NCHW: why"), ("fused", "pad-matmul", "padded")]


def test_cudnn_rule_keeps_a_grouped_training_step_in_nchw_forward_and_backward(monkeypatch: pytest.MonkeyPatch):
    """The whole backend on a ResNeXt-style block, with the GPU's cuDNN rule run on CPU
    tensors: both the forward and the backward graph decline, their convolutions (and
    convolution gradients) stay NCHW, the gradients match eager, and the report says why."""
    own = CppTarget.graph_rewrites
    layouts: list = []

    def rewrites(self, gm, example_inputs, stage):
        kept = layout_passes.forward_user_outputs() if stage == "aot_forward" else None
        if stage == "aot_forward" and kept is None:
            return own(self, gm, example_inputs, stage)
        done = own(self, gm, example_inputs, stage) + layout_passes.channels_last_convolutions(
            gm, require_cuda=False, cudnn=True, stage=stage, kept_outputs=kept)
        layouts.extend(n.args[0].meta["val"].is_contiguous() for n in gm.graph.nodes
                       if n.target in (aten.convolution.default, aten.convolution_backward.default))
        return done

    monkeypatch.setattr(CppTarget, "graph_rewrites", rewrites)

    class Grouped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(3, 16, 1, bias=False)
            self.g = nn.Conv2d(16, 16, 3, padding=1, groups=4, bias=False)
            self.bn = nn.BatchNorm2d(16)
            self.fc = nn.Linear(16, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(F.relu(self.bn(self.g(F.relu(self.a(x))))).mean((2, 3)))

    events = _one_step_as_eager(Grouped)
    assert len(layouts) == 4 and all(layouts)  # two convolutions, two convolution gradients: all NCHW
    declined = [e for e in events if isinstance(e, FusionDecision) and e.rule == "channels-last"]
    assert len(declined) == 2 and all(e.decision == "not_fused" and "4 groups reading 4 channels each" in e.reason
                                      for e in declined)


def test_a_16_bit_training_step_saves_each_cast_weight_once_in_nhwc(backward_convolutions: list) -> None:
    """Under autocast the forward casts each convolution's weight and saves the cast for
    the backward; the channels-last rule copies it to NHWC for cuDNN. The forward saves
    that copy instead of storing both, and the backward computes eager's gradients from it."""
    from fuselens.compiler.runtime import wrapper_codegen

    ref, model, x, y = _twin_blocks()
    compiled = torch.compile(model, backend="fuselens")
    with wrapper_codegen.recorded_sources() as sources, torch.autocast("cpu", dtype=torch.bfloat16):
        out = _step(compiled, x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _step(ref, x, y)
    torch._dynamo.reset()
    torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-2, msg=name)
    forward = sources[0]
    # conv1's weight (8, 8, 3, 3) cast to bf16: one buffer, in NHWC
    made = re.findall(r"= _empty\w*\(\(8, 8, 3, 3, \), \(([\d, ]+)\)", forward)
    assert made == ["72, 1, 24, 8, "], forward
    convolutions = [c for c in backward_convolutions if c[0] != "gradient"]
    assert convolutions and all(inp.is_contiguous(memory_format=torch.channels_last) for _, inp in convolutions)
