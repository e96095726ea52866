"""`x[idx] = v` (aten.index_put without accumulate) with a few positions along one dim is
a generated kernel (compiler/lowering/indexing.py): a static KV cache's `index_copy_` at
the decoded position, assignments to a few rows, and their gradients. Values equal to
eager's, nothing left to ATen; more positions than SCATTER_MAX_PER_LINE stay ATen's. So is
`x[mask] = v` through a boolean mask with one value (a `where`), and its gradient."""

from __future__ import annotations

import torch

import fuselens.compiler  # noqa: F401  (registers backend="fuselens")
from fuselens import sink
from fuselens.events import ErrorEntry


def _run(fn, *args):
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(fn, backend="fuselens", options={"target": "cpp", "fallback_on_error": False})(*args)
    left = sorted({e.message.split(" runs in ATen")[0] for e in events if isinstance(e, ErrorEntry)})
    return out, left


def test_assignments_to_a_few_rows_match_eager_with_negative_and_repeated_indices():
    def rows(x, i, v):
        y = x.clone()
        y[i] = v
        return y * 2

    def columns_broadcast(x, i, v):  # values broadcast to x[:, i]'s shape
        y = x.clone()
        y[:, i] = v
        return y

    x = torch.randn(10, 6)
    for fn, args in ((rows, (x, torch.tensor([1, -2, 4]), torch.randn(3, 6))),
                     (rows, (x, torch.tensor([3, 3]), torch.randn(2, 6))),  # the last one wins, as ATen's CPU kernel
                     (columns_broadcast, (x, torch.tensor([0, 5]), torch.randn(2)))):
        out, left = _run(fn, *args)
        assert left == [], left
        assert torch.equal(out, fn(*args)), fn.__name__


def test_a_static_kv_cache_update_at_the_decoded_position_is_generated():
    """transformers' StaticCache writes each step's keys with `index_copy_` at
    `cache_position`: the graph mutates the cache it was given."""
    def step(cache, pos, k):
        cache.index_copy_(2, pos, k)
        return cache.sum(-1)

    cache = torch.zeros(1, 2, 16, 8)
    pos, k = torch.tensor([5]), torch.randn(1, 2, 1, 8)
    ref_cache = cache.clone()
    ref = step(ref_cache, pos, k)
    out, left = _run(step, cache, pos, k)
    assert left == [], left
    assert torch.equal(out, ref) and torch.equal(cache, ref_cache)


def test_gradients_through_an_assignment_match_eager():
    def f(x, v, i):
        y = x * 1.5
        y[i] = v * 3
        return (y.sin() * torch.arange(y.numel()).view_as(y)).sum()

    x, v, i = torch.randn(8, 4), torch.randn(2, 4), torch.tensor([6, 1])
    xe, ve = x.clone().requires_grad_(), v.clone().requires_grad_()
    f(xe, ve, i).backward()
    xc, vc = x.clone().requires_grad_(), v.clone().requires_grad_()
    (loss, left) = _run(f, xc, vc, i)
    loss.backward()
    assert left == [], left
    torch.testing.assert_close(xc.grad, xe.grad)
    torch.testing.assert_close(vc.grad, ve.grad)


def test_a_boolean_mask_assignment_of_one_value_is_generated_forward_and_backward():
    """`t[t == 2] = big` (Longformer's global-attention mask), a mask over trailing dims, a
    one-element tensor value: each a `where`, equal to eager's, the gradient too, nothing
    left to ATen. A mask with many values (`x[mask] = v` of a selected count) stays ATen's."""
    def leading(x, a):
        y = x * 2
        y[a == 2] = torch.finfo(x.dtype).max
        return y + 1

    def trailing(x, a):
        y = x * 2
        y[:, a[0] > 0] = -1.0
        return y

    def one_element(x, a):
        y = x.clone()
        y[a > 1] = torch.tensor([3.0])
        return y * 3

    x, a = torch.randn(4, 6), torch.randint(0, 3, (4, 6))
    for fn in (leading, trailing, one_element):
        out, left = _run(fn, x, a)
        assert left == [], (fn.__name__, left)
        assert torch.equal(out, fn(x, a)), fn.__name__
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    (leading(xe, a) * torch.arange(24.0).view(4, 6)).sum().backward()
    out, left = _run(lambda x, a: (leading(x, a) * torch.arange(24.0).view(4, 6)).sum(), xc, a)
    out.backward()
    assert left == [] and torch.equal(xc.grad, xe.grad)

    def many(x, a, v):
        y = x.clone()
        y[a == 2] = v
        return y

    a = torch.tensor([[2, 0, 2, 1, 0, 0]] * 4)
    v = torch.randn(8)
    out, left = _run(many, x, a, v)
    assert torch.equal(out, many(x, a, v)) and left == ["aten.index_put.default"], left


def test_many_positions_stay_atens():
    def inverse(perm):  # a permutation's inverse: one position per element
        return torch.empty_like(perm).index_put_((perm,), torch.arange(perm.numel()))

    perm = torch.randperm(32)
    out, left = _run(inverse, perm)
    assert torch.equal(out, inverse(perm))
    assert left == ["aten.index_put.default"], left


def test_greedy_generation_with_a_static_kv_cache_matches_eager_with_nothing_left_to_aten():
    """The program Hugging Face documents for torch.compile: `generate` with
    `cache_implementation="static"` and the forward compiled. Each step writes its keys
    and values into the cache with `index_copy_`, which ran in ATen."""
    import pytest

    T = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2, intermediate_size=128, vocab_size=503,
                                             max_position_embeddings=128)).eval()
    ids = torch.randint(0, 503, (1, 8))
    kw = dict(max_new_tokens=6, do_sample=False, cache_implementation="static", pad_token_id=0)
    ref = model.generate(ids, **kw)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="fuselens", options={"fallback_on_error": False})
    with sink.collect() as events:
        out = model.generate(ids, **kw)
    assert torch.equal(out, ref)
    assert not [e.message for e in events if isinstance(e, ErrorEntry)]
