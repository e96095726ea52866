"""Lowering rules that only a CUDA graph exercises. Marked `gpu`: CI has no GPU, so these
run on the GPU machine (`python -m pytest -m gpu tests/test_gpu_lowering.py`)."""

from __future__ import annotations

import pytest
import torch

import fuselens.compiler
from fuselens import sink
from fuselens.events import ErrorEntry, Kernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_same_device_to_copy_is_a_conversion_fused_into_a_kernel_not_an_aten_fallback():
    fuselens.compiler.register()  # a source checkout on the GPU machine has no entry point

    def mean_over_tokens(x, labels):  # what a Hugging Face causal-LM loss does with its token count
        return x.sum() / (labels != -100).sum().to(x.device, torch.float32)

    x, labels = torch.randn(4096, device="cuda"), torch.randint(-100, 3, (4096,), device="cuda")
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(mean_over_tokens, backend="fuselens")(x, labels)
    torch.testing.assert_close(out, mean_over_tokens(x, labels))
    assert not [e.message for e in events if isinstance(e, ErrorEntry) and "another device" in e.message]
    assert [k.kind for k in events if isinstance(k, Kernel)] and all(
        k.kind == "triton" for k in events if isinstance(k, Kernel)), [k.kind for k in events if isinstance(k, Kernel)]


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["launches", "cuda-graphs"])
def test_batchnorm_and_optimizer_input_mutations_on_cuda_match_eager(cuda_graphs):
    """Kernels store BatchNorm's running stats and SGD's parameters and momentum straight
    into the inputs; under CUDA graphs a static input is updated once a call (not again
    by the warm-up before capture) and a copied one is copied back after each replay."""
    import sys
    from pathlib import Path

    fuselens.compiler.register()
    sys.path.insert(0, str(Path(__file__).parent))
    from test_input_mutations import _functions, _sgd_momentum, _train_bn

    opts = {"fallback_on_error": False, "cuda_graphs": cuda_graphs}
    torch.backends.cudnn.allow_tf32 = False  # float32 convolutions on both sides: the tolerances are float32's
    with torch.device("cuda"):
        torch._dynamo.reset()
        assert _train_bn(opts) == []
        assert _functions(opts) == []
        torch._dynamo.reset()
        assert _sgd_momentum(opts) == []


def test_cuda_graph_reads_another_graphs_replayed_output_in_place_and_stays_right():
    """A loss compiled apart from its model (a graph break) gets the model graph's
    replayed logits: read in place instead of copied, and still each call's values."""
    fuselens.compiler.register()
    torch._dynamo.reset()
    opts = {"cuda_graphs": True, "fallback_on_error": False}
    head = torch.compile(lambda x: (x * 2).exp(), backend="fuselens", options=opts)
    loss = torch.compile(lambda y: y.sum(-1), backend="fuselens", options=opts)
    for _ in range(5):
        x = torch.randn(64, 128, device="cuda")
        torch.testing.assert_close(loss(head(x)), (x * 2).exp().sum(-1))
