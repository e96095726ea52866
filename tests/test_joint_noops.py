"""No-op copies leave a joint graph before it is partitioned (compiler/joint_noops.py)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fuselens.compiler  # noqa: F401
import fuselens.compiler.joint_noops as joint_noops
from fuselens.compiler.joint_noops import drop_noop_copies

aten = torch.ops.aten


def _targets(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_a_copy_with_its_inputs_layout_is_removed_and_readers_read_the_input():
    def fn(x):
        return (torch.relu(x).clone() * 2).clone().sum(0)

    x = torch.randn(4, 5)
    gm = make_fx(fn, tracing_mode="fake")(x)
    assert drop_noop_copies(gm.graph) == 2
    gm.recompile()
    assert "aten.clone.default" not in _targets(gm)
    torch.testing.assert_close(gm(x), fn(x))


def test_a_copy_to_another_layout_stays():
    def fn(x):
        return x.relu().clone(memory_format=torch.channels_last) + 1

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(2, 3, 4, 4))
    assert drop_noop_copies(gm.graph) == 0


def test_an_output_copy_of_an_input_or_of_another_output_stays():
    """Eager returns separate tensors there; removing the copy would make them share memory."""
    def fn(x):
        y = x * 2
        return x.clone(), y, y.clone(), y.view(-1).clone()

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(3, 4))
    assert drop_noop_copies(gm.graph) == 0


def _saved_bytes_of_phi_training_step() -> int:
    import transformers

    torch.manual_seed(0)
    model = transformers.PhiForCausalLM(transformers.PhiConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=97,
        max_position_embeddings=64, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)).train()
    ids = torch.randint(0, 97, (2, 32))
    compiled = torch.compile(model, backend="fuselens")
    saved: dict = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    torch._dynamo.reset()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
    finally:
        torch._dynamo.reset()
    return sum(saved.values())


def test_phi_training_saves_less_for_its_backward_once_the_dropout_copies_are_gone(monkeypatch):
    """Phi's dropouts of probability 0 trace as clones; with them in the joint graph the
    partitioner saved each layer norm's float32 normalized rows instead of the bfloat16
    sum they come from (the H200's Phi training peak was 4 MB above Inductor's)."""
    without = _saved_bytes_of_phi_training_step()
    monkeypatch.setattr(joint_noops, "drop_noop_copies", lambda graph: 0)
    with_copies = _saved_bytes_of_phi_training_step()
    assert without < with_copies, (without, with_copies)
