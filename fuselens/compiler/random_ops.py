"""Random numbers inside generated kernels (dropout, `rand_like`, `randn_like`, `bernoulli`).

Eager draws each random tensor in a kernel of its own; so did we (an ATen step
that also kept its neighbours from fusing: a training forward wrote the dropout
input, the random tensor, then read both again). Like Inductor, a graph's random
ops now become counter-based random numbers computed where they are used:

* `random_in_kernels` (a graph rewrite) replaces each random op by
  `fuselens::random(seeds, k, size, stride, dtype, normal)` and puts one
  `fuselens::random_seeds(n, device)` at the top of the graph: n seeds drawn
  from torch's generator for that device at every call (one small kernel). So
  `torch.manual_seed` makes compiled runs repeat, each call draws new numbers, and
  under CUDA graphs each replay does too (the draw is captured with the
  generator's graph-safe state).
* Element i of the k-th random tensor is Philox4x32-10 of counter (i, 0, 0, 0) and
  key seeds[k], the generator of `tl.rand`/`tl.randn`. Its value depends on (seed,
  i) alone, so a kernel may recompute it (a dropout mask saved for the backward and
  the scaled output read the same numbers). The C++ target and `philox_uniform`
  (below, torch ops: the ATen path and the tests' reference) compute the same bits.
* The numbers are not eager's: eager's generator has its own stream. Option
  `fallback_random` keeps every random op in ATen, with eager's numbers, as
  Inductor's `fallback_random` does.

Float64 results stay in ATen (these are float32 numbers), as do calls with an
explicit generator.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.fx

from fuselens.compiler.graph_passes import GraphRewrite, _Builder, _fake_mode, _val

aten = torch.ops.aten

# Philox4x32 constants (Salmon et al. 2011), as in Triton's philox_impl
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
# int32 bits -> [0, 1): the largest scale with MAX_INT * scale < 1 in float32 (Triton's)
UNIFORM_SCALE = 4.6566127342e-10
NORMAL_MIN_U = 1.0e-7  # Box-Muller's u1 floor (Triton's), so log(u1) is finite
SEED_HIGH = 2**63 - 1
_M32 = 0xFFFFFFFF


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # b < 2^32 and a < 2^32: the product fits 64 bits; int64 wraps, its bits are the unsigned product's
    p = b * a
    return (p >> 32) & _M32, p & _M32


def philox(seed: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four 32-bit words (as int64 tensors) of Philox4x32-10 at counter
    (offset, 0, 0, 0) (64-bit offsets: (lo, hi, 0, 0)) and key (seed lo, seed hi)."""
    offset = offset.to(torch.int64)
    c0, c1 = offset & _M32, (offset >> 32) & _M32
    c2 = c3 = torch.zeros_like(offset)
    seed = seed.to(torch.int64)
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(ROUNDS):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def _uniform(word: torch.Tensor) -> torch.Tensor:
    x = torch.where(word >= 2**31, word - 2**32, word)  # the word's bits as int32
    x = torch.where(x < 0, -x - 1, x)  # ~x
    return x.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32)


def philox_uniform(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """`tl.rand(seed, offset)`: float32 in [0, 1)."""
    return _uniform(philox(seed, offset)[0])


def philox_normal(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """`tl.randn(seed, offset)`: Box-Muller of the first two words."""
    w = philox(seed, offset)
    u1 = _uniform(w[0]).clamp_min(NORMAL_MIN_U)
    th = _uniform(w[1]) * 6.283185307179586
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(th)


@torch.library.custom_op("fuselens::random", mutates_args=())
def random_tensor(seeds: torch.Tensor, index: int, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                  normal: bool) -> torch.Tensor:
    """The `index`-th random tensor of a graph, of `size` and `stride` (empty:
    contiguous): element i (row-major over `size`) is `philox_uniform(seeds[index], i)`,
    or `philox_normal`. Kernels compute it in place; this runs where one cannot."""
    n = 1
    for s in size:
        n *= s
    offsets = torch.arange(n, device=seeds.device, dtype=torch.int64)
    values = (philox_normal if normal else philox_uniform)(seeds[index], offsets).view(list(size))
    return _empty(seeds, size, stride, dtype).copy_(values)


@random_tensor.register_fake
def _random_fake(seeds: torch.Tensor, index: int, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                 normal: bool) -> torch.Tensor:
    return _empty(seeds, size, stride, dtype)


def _empty(seeds: torch.Tensor, size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    if not stride:
        return torch.empty(list(size), dtype=dtype, device=seeds.device)
    return torch.empty_strided(list(size), list(stride), dtype=dtype, device=seeds.device)


def draw_seeds(count: int, device: torch.device) -> torch.Tensor:
    """`count` seeds from torch's generator for `device` (generated wrappers call this directly)."""
    return torch.randint(SEED_HIGH, (count,), device=device, dtype=torch.int64)


@torch.library.custom_op("fuselens::random_seeds", mutates_args=())
def random_seeds(count: int, device: torch.device) -> torch.Tensor:
    """A graph's seeds, drawn at every call (see the module docstring)."""
    return draw_seeds(count, device)


@random_seeds.register_fake
def _random_seeds_fake(count: int, device: torch.device) -> torch.Tensor:
    return torch.empty((count,), dtype=torch.int64, device=device)


RANDOM = torch.ops.fuselens.random.default
SEEDS = torch.ops.fuselens.random_seeds.default

_IN_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LIKE = {aten.rand_like.default: False, aten.randn_like.default: True}
_NEW = {aten.rand.default: False, aten.randn.default: True}


def _replaced_op(node: torch.fx.Node) -> Optional[tuple[bool, str]]:
    """(normal, what it is) for a random op this pass replaces, else None."""
    if node.op != "call_function":
        return None
    val = _val(node)
    if not isinstance(val, torch.Tensor) or val.dtype not in _IN_KERNEL_DTYPES or val.device.type not in ("cpu", "cuda"):
        return None
    if node.target in _LIKE or node.target in _NEW:
        return (_LIKE.get(node.target, _NEW.get(node.target)), node.target.__name__.split(".")[0])
    if node.target is aten.bernoulli.p and node.kwargs.get("generator") is None and len(node.args) < 3:
        p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
        return (False, "bernoulli") if isinstance(p, (int, float)) else None
    return None


def _layout_args(bld: Any, node: torch.fx.Node, val: torch.Tensor, symbols: dict, at: int) -> tuple[list, list]:
    """`val`'s size and stride as op arguments: ints, or for a symbolic one the node that
    already holds it before position `at` (`symbols`: an input, a size read earlier), else
    one reading it off the tensor the op is shaped like; stride [] when contiguous."""
    like = node.args[0] if node.target in _LIKE or node.target is aten.bernoulli.p else None

    def arg(v: Any, read: Any, d: int) -> Any:
        if isinstance(v, int):
            return v
        held = symbols.get(v.node.expr)
        return held[1] if held is not None and held[0] < at else bld.call(read, like, d)

    if like is None:
        size = list(node.args[0])
    else:
        size = [arg(s, aten.sym_size.int, d) for d, s in enumerate(val.shape)]
    if val.is_contiguous() or like is None:  # rand/randn make contiguous tensors
        return size, []
    return size, [arg(s, aten.sym_stride.int, d) for d, s in enumerate(val.stride())]


def _symbol_nodes(gm: torch.fx.GraphModule) -> dict:
    """Symbolic size expression -> (position, the first node holding it as its value)."""
    out: dict = {}
    for i, n in enumerate(gm.graph.nodes):
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            out.setdefault(v.node.expr, (i, n))
    return out


def _drop_if_dead(gm: torch.fx.GraphModule, nodes: Sequence[Any]) -> None:
    """Remove the inputs of a replaced op that nothing reads any more (the
    `torch.empty` that `bernoulli_` filled): their values were never used."""
    for n in nodes:
        if isinstance(n, torch.fx.Node) and n.op == "call_function" and not n.users and not n.is_impure():
            gm.graph.erase_node(n)


def random_in_kernels(gm: torch.fx.GraphModule) -> list:
    """The rewrite of the module docstring; returns `GraphRewrite`s for the report."""
    found = [(i, n, r) for i, n in enumerate(gm.graph.nodes) if (r := _replaced_op(n)) is not None]
    if not found:
        return []
    mode = _fake_mode(gm)
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    counts: dict[torch.device, int] = {}
    for _, node, _ in found:
        counts[_val(node).device] = counts.get(_val(node).device, 0) + 1
    seeds = {device: _Builder(gm, first, mode).call(SEEDS, count, device) for device, count in counts.items()}
    symbols = _symbol_nodes(gm)  # positions before any node is added: a size it holds must come before the draw
    done = []
    taken = dict.fromkeys(counts, 0)
    for at, node, (normal, what) in found:
        val = _val(node)
        k = taken[val.device]
        taken[val.device] += 1
        bld = _Builder(gm, node, mode)
        size, stride = _layout_args(bld, node, val, symbols, at)
        if what == "bernoulli":
            u = bld.call(RANDOM, seeds[val.device], k, size, stride, torch.float32, False)
            p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
            new = bld.call(aten._to_copy.default, bld.call(aten.lt.Scalar, u, p), dtype=val.dtype)
        else:
            new = bld.call(RANDOM, seeds[val.device], k, size, stride, val.dtype, normal)
        inputs = node.all_input_nodes
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        _drop_if_dead(gm, inputs)
        done.append(GraphRewrite("random-in-kernel", node.name,
                                 f"{node.name}: {what} is computed inside the kernels that read it (Philox, "
                                 "seeded from torch's generator at each call), not in a kernel of its own"))
    gm.graph.lint()
    gm.recompile()
    return done
