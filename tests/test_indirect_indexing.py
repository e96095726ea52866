"""Embedding, gather, advanced indexing and index_select are generated code
(compiler/lowering/indexing.py): an index
read from a tensor enters the data's index expression (`ir.Indirect`), so a token
embedding fuses with the position embedding and the layernorm after it, and a
cross-entropy's gather with the loss. Values and gradients as eager's, no ATen
fallback; C++ in-process, Triton in its CPU interpreter (subprocess), including
inside a looped reduction (the index read in the r loop) and a pad's edge test on a
gathered index (an index expression of a loaded value is a block, not a scalar)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


def _cases() -> dict:
    g = torch.Generator().manual_seed(0)
    wte, wpe = torch.randn(100, 32, generator=g), torch.randn(16, 32, generator=g)
    ln_w, ln_b = torch.randn(32, generator=g), torch.randn(32, generator=g)
    ids = torch.randint(0, 100, (2, 16), generator=g)
    pos = torch.arange(16)[None].expand(2, 16)
    logits = torch.randn(64, 1003, generator=g)
    target = torch.randint(0, 1003, (64,), generator=g)
    target[5] = -100  # an ignored row: its clamped gather is masked out by the loss
    table = torch.randn(2, 30000, generator=g)
    picks = torch.randint(0, 30000, (2, 20000), generator=g)  # rows past PERSISTENT_MAX: a looped reduction
    bias_table = torch.randn(169, 3, generator=g)  # Swin's relative position bias: a table read at a [49, 49] index
    rel = torch.randint(0, 169, (49, 49), generator=g)
    x4 = torch.randn(3, 5, 6, 2, generator=g)
    rows, cols = torch.tensor([[0], [-1]]), torch.tensor([1, 5, -2])  # broadcast to [2, 3]; negatives from the end
    feats, pick = torch.randn(4, 7, 3, generator=g), torch.tensor([6, 0, 0, 2])

    def embed_norm(wte, wpe, ids, pos, w, b):
        return F.layer_norm(F.embedding(ids, wte) + F.embedding(pos, wpe), (32,), w, b)

    def loss(logits, target):
        return F.cross_entropy(logits, target)

    def gathered_sum(table, picks):  # the gathered value feeds a row reduction (looped in Triton)
        return table.gather(1, picks).sum(1)

    def relative_bias(table, rel):
        return table[rel.view(-1)].view(49, 49, -1).permute(2, 0, 1).contiguous() * 2

    def adjacent(x, rows, cols):  # indexed dims side by side: the broadcast shape takes their place
        return x[:, rows, cols].exp()

    def apart(x, rows, cols):  # a slice between them: the broadcast shape comes first
        return x[rows, :, cols] + 1

    def selected(x, pick):
        return torch.index_select(x, 1, pick).relu()

    def padded_rows(x, spans):  # ConvBERT's span gather: the pad's edge test reads a gathered index
        return F.pad(x, (0, 0, 4, 4))[:, spans] * 2

    return {"embed_norm": (embed_norm, (wte, wpe, ids, pos, ln_w, ln_b)), "loss": (loss, (logits, target)),
            "gathered_sum": (gathered_sum, (table, picks)), "relative_bias": (relative_bias, (bias_table, rel)),
            "adjacent": (adjacent, (x4, rows, cols)), "apart": (apart, (x4, rows, cols)),
            "index_select": (selected, (feats, pick)),
            "padded_rows": (padded_rows, (torch.randn(2, 10, 8, generator=g), torch.randint(0, 18, (10, 9), generator=g)))}


def _mismatches(opts: dict) -> list[str]:
    from fuselens import sink
    from fuselens.events import ErrorEntry

    bad = []
    for name, (fn, args) in _cases().items():
        for train in (False, True):
            torch._dynamo.reset()
            leaves = [a.detach().clone().requires_grad_(train and a.is_floating_point()) for a in args]
            refs = [a.detach().clone().requires_grad_(train and a.is_floating_point()) for a in args]
            with sink.collect() as events:
                out = torch.compile(fn, backend="fuselens", options=opts)(*leaves)
                if train:
                    out.sum().backward()
            ref = fn(*refs)
            if train:
                ref.sum().backward()
            ok = torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
            for a, b in zip(leaves, refs):
                if train and a.is_floating_point():
                    ok = ok and torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-5)
            fell_back = [e.message for e in events if isinstance(e, ErrorEntry)
                         and any(f"aten.{op} " in e.message
                                 for op in ("embedding.default", "gather.default", "index.Tensor", "index_select.default"))]
            if not ok or fell_back:
                bad.append(f"{name} train={train}" + (f" ({fell_back[0][:120]})" if fell_back else ""))
    return bad


def test_embedding_and_gather_match_eager_as_generated_cpp() -> None:
    assert _mismatches({"target": "cpp", "fallback_on_error": False}) == []


def test_token_and_position_embeddings_fuse_with_their_layernorm() -> None:
    from fuselens import sink
    from fuselens.events import Kernel

    fn, args = _cases()["embed_norm"]
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(fn, backend="fuselens")(*args)
    torch.testing.assert_close(out, fn(*args))
    kernels = [k for k in events if isinstance(k, Kernel)]
    assert [k.kind for k in kernels] == ["cpp"], [k.name for k in kernels]  # one kernel, no ATen embedding
    assert "embedding" in kernels[0].name


def test_bfloat16_embedding_rows_are_copied_exactly() -> None:
    wte = torch.randn(50, 8).bfloat16()
    ids = torch.randint(0, 50, (3, 7))
    torch._dynamo.reset()
    out = torch.compile(lambda w, i: F.embedding(i, w), backend="fuselens", options={"fallback_on_error": False})(wte, ids)
    assert out.dtype == torch.bfloat16 and torch.equal(out, F.embedding(ids, wte))


def test_an_index_outside_the_table_reads_inside_the_buffer() -> None:
    # eager raises; the kernel must not read outside the weight (it clamps to the nearest row)
    wte = torch.randn(10, 4)
    ids = torch.tensor([[3, 12, -2]])
    torch._dynamo.reset()
    out = torch.compile(lambda w, i: F.embedding(i, w) * 2, backend="fuselens")(wte, ids)
    torch.testing.assert_close(out, wte[[3, 9, 0]][None] * 2)


def test_embedding_and_gather_match_eager_in_the_triton_interpreter(tmp_path: Path) -> None:
    records = interpreted_worker_records(__file__, tmp_path / "records.json", 900, "indirect-indexing worker")
    assert records == {"bad": []}


if __name__ == "__main__":  # pragma: no cover
    worker_main(lambda opts: {"bad": _mismatches(opts)}, "fl_indirect_")
