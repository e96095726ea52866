"""Constant folding: the part of an AOT graph that reads no input is computed once,
at compile time, and the graph reads the result as a constant.

Swin's shifted-window attention builds its attention mask in every forward from
Python numbers (`attn_mask[h0:h1, w0:w1] = count`, nine slices a block): each
assignment lifts a 0-d CPU tensor into the graph, copied to the GPU at every call:
45 kernels and 45 host-to-device copies a step (Swin-T inference on the H200, 1.2 of
its 10.9 ms of host time). Inductor recomputes the masks inside each softmax's kernel.

What is folded: a node is constant when it is a pure ATen op (no mutation, no
random numbers, no uninitialized memory) of static shape whose tensor inputs are
constants (`get_attr` tensors, which AOTAutograd keeps only for literals such as
`torch.tensor(3.0)`: parameters and buffers are inputs) or, for `new_zeros`-like
and `zeros_like`-like ops, tensors whose metadata alone it reads. The constants
that non-constant nodes read are evaluated eagerly and become `get_attr` buffers,
except where that would cost more than it saves:

* a creation op alone (`full`, `arange`) or a value that is one number repeated:
  a kernel computes it inline for nothing, a buffer would be read from memory;
* a view of a constant (an `expand` of the mask to the batch): the tensor viewed
  is folded instead, so the buffer holds no repeated elements;
* a result over `MAX_FOLDED_BYTES`: the constants it reads are folded instead.

Computations on creation ops alone stay inline too, except one whose value is one
number repeated (a mask built from `ones`): that becomes a `full` of the number, so
its readers see a constant.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from fuselens.compiler import ir
from fuselens.compiler.graph_passes import GraphRewrite, _static

aten = torch.ops.aten

# A folded constant lives as long as the compiled graph: above this, recompute it.
MAX_FOLDED_BYTES = 16 << 20

# Ops whose first argument contributes only its dtype, device (and for *_like its shape).
_METADATA_ARG_OPS = {
    aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
    aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
}
# Uninitialized memory: nothing to fold.
_UNINITIALIZED = {
    aten.empty.memory_format, aten.empty_strided.default, aten.new_empty.default,
    aten.new_empty_strided.default, aten.empty_like.default, aten.empty_permuted.default,
}


def fold_constants(gm: torch.fx.GraphModule) -> list[GraphRewrite]:
    """Fold the graph's input-independent subgraphs (module docstring); returns one
    record per folded constant."""
    const = _constant_nodes(gm)
    if not any(n.op == "call_function" for n in const):
        return []
    values: dict[torch.fx.Node, Any] = {}
    rewrites: list[GraphRewrite] = []
    folded: set[torch.fx.Node] = set()  # replaced by a constant
    frontier = [n for n in gm.graph.nodes if n in const and any(u not in const for u in n.users)]
    with unset_fake_temporarily():  # AOTAutograd calls the backend under its fake mode: these values are real
        for n in frontier:
            _fold_at(gm, n, const, values, folded, rewrites)
    if folded:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return rewrites


def _constant_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    const: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op == "get_attr" and isinstance(getattr(gm, n.target, None), torch.Tensor):
            const.add(n)
        elif n.op == "call_function" and _pure(n) and _static_tensor(n.meta.get("val")):
            inputs = _data_inputs(n)
            if all(i in const for i in inputs):
                const.add(n)
    return const


def _pure(n: torch.fx.Node) -> bool:
    op = n.target
    if not isinstance(op, torch._ops.OpOverload) or op in _UNINITIALIZED:
        return False
    if torch.Tag.nondeterministic_seeded in op.tags or op._schema.is_mutable:
        return False
    return True


def _static_tensor(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and _static(*val.shape, *val.stride())


def _data_inputs(n: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes whose values (not only metadata) `n` reads."""
    args = n.args[1:] if n.target in _METADATA_ARG_OPS else n.args
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((args, n.kwargs), found.append)
    return found


def _fold_at(gm: torch.fx.GraphModule, n: torch.fx.Node, const: set, values: dict, folded: set,
             rewrites: list[GraphRewrite]) -> None:
    """Fold `n`, or where folding it costs more than it saves, the constants it reads."""
    if n.op != "call_function" or n in folded:
        return
    inputs = [i for i in _data_inputs(n) if i.op == "call_function"]
    val = n.meta["val"]
    too_big = val.numel() * val.element_size() > MAX_FOLDED_BYTES
    if ir.returns_alias(n) or too_big:
        for i in inputs:
            _fold_at(gm, i, const, values, folded, rewrites)
        return
    if not _reads_literal(n, const):
        # creation ops and index arithmetic (a roll's `arange`): computed inline by their
        # readers, but one number repeated becomes a `full` of it
        _fold_uniform(gm, n, values, folded, rewrites)
        return
    if n.target is aten.lift_fresh_copy.default:
        return  # the literal itself: already a constant
    real = _evaluate(gm, n, values)
    if real is not None and (real.device != val.device or real.dtype != val.dtype
                             or tuple(real.shape) != tuple(val.shape)):
        # eager evaluation here disagrees with the traced value (a literal kept on the CPU
        # for a graph on CUDA): readers and the graph's outputs expect the traced one
        real = real.to(device=val.device, dtype=val.dtype) if tuple(real.shape) == tuple(val.shape) else None
    if real is None or _uniform(real):
        for i in inputs:
            _fold_at(gm, i, const, values, folded, rewrites)
        return
    if tuple(real.stride()) != tuple(val.stride()) and real.numel() > 1:
        real = torch.empty_strided(val.shape, val.stride(), dtype=val.dtype, device=val.device).copy_(real)
    name = _free_name(gm)
    gm.register_buffer(name, real)
    with gm.graph.inserting_before(n):
        _replace(n, gm.graph.get_attr(name), folded)
    ops = _count_ops(n, const)
    shape = "x".join(str(s) for s in val.shape) or "0-d"
    rewrites.append(GraphRewrite(
        "constant-fold", n.name,
        f"computed once at compile time: {ops} operation{'s' * (ops != 1)} that read no input "
        f"(a {shape} {str(val.dtype).removeprefix('torch.')} tensor)"))


def _fold_uniform(gm: torch.fx.GraphModule, n: torch.fx.Node, values: dict, folded: set,
                  rewrites: list[GraphRewrite]) -> None:
    """Replace `n`, computed from creation ops alone, by a `full` of its value when that
    is one number repeated. A Hugging Face model called without an attention mask
    builds one from `ones` (DeBERTa: ones * ones != 0, negated): its readers then see a
    constant, and a `where` on it keeps one branch instead of masking every load with it."""
    val = n.meta["val"]
    if not any(i.op == "call_function" for i in _data_inputs(n)):
        return  # a creation op itself (`ones`, `new_full`): its readers see its number already
    if not val.is_contiguous() or val.numel() > _UNIFORM_MAX_NUMEL:
        return
    real = _evaluate(gm, n, values)
    if real is None or tuple(real.shape) != tuple(val.shape) or real.dtype != val.dtype:
        return
    if not (real.numel() == 1 or _uniform(real)):
        return
    number = real.reshape(-1)[0].item()
    with gm.graph.inserting_before(n):
        _replace(n, gm.graph.call_function(aten.full.default, (list(val.shape), number),
                                           {"dtype": val.dtype, "device": val.device, "pin_memory": False}), folded)
    rewrites.append(GraphRewrite("constant-fold", n.name, f"one number repeated ({number}): "
                                 "computed at compile time, read as that number"))


def _replace(n: torch.fx.Node, node: torch.fx.Node, folded: set) -> None:
    """`node` (a constant's value) in place of `n` for all its readers, with its traced
    value and the source line a finding points at."""
    node.meta["val"] = n.meta["val"]
    for key in ("stack_trace", "original_aten"):
        if key in n.meta:
            node.meta[key] = n.meta[key]
    n.replace_all_uses_with(node)
    folded.add(n)


# Creation-op subgraphs larger than this are not evaluated at compile time to look for one number.
_UNIFORM_MAX_NUMEL = 1 << 20


def _evaluate(gm: torch.fx.GraphModule, n: torch.fx.Node, values: dict) -> Optional[torch.Tensor]:
    """`n`'s real value, computed eagerly from the constants it reads (memoized)."""
    if n in values:
        return values[n]
    if n.op == "get_attr":
        out = getattr(gm, n.target)
    else:
        def value(a: torch.fx.Node) -> Any:
            return _evaluate(gm, a, values)

        args = n.args
        if n.target in _METADATA_ARG_OPS:
            meta = n.args[0].meta["val"]
            shape = (0,) if n.target.__name__.startswith("new_") else meta.shape  # new_*: dtype and device only
            stand_in = torch.empty(shape, dtype=meta.dtype, device=meta.device)
            args = (stand_in, *torch.fx.node.map_arg(n.args[1:], value))
        else:
            args = torch.fx.node.map_arg(args, value)
        kwargs = torch.fx.node.map_arg(n.kwargs, value)
        try:
            out = n.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op we cannot run eagerly here: left to the kernels
            out = None
    values[n] = out
    return out


def _uniform(t: torch.Tensor) -> bool:
    if t.numel() <= 1:
        return False
    flat = t.reshape(-1)
    return torch.equal(flat, flat[:1].expand_as(flat))


def _constant_sources(n: torch.fx.Node, const: set) -> set[torch.fx.Node]:
    """`n` and the constants it is computed from, transitively."""
    seen: set[torch.fx.Node] = set()
    stack = [n]
    while stack:
        m = stack.pop()
        if m not in seen:
            seen.add(m)
            stack.extend(i for i in _data_inputs(m) if i in const)
    return seen


def _reads_literal(n: torch.fx.Node, const: set) -> bool:
    """Whether a `get_attr` tensor is among the constants `n` is computed from."""
    return any(m.op == "get_attr" for m in _constant_sources(n, const))


def _count_ops(n: torch.fx.Node, const: set) -> int:
    return sum(m.op == "call_function" for m in _constant_sources(n, const))


def _free_name(gm: torch.fx.GraphModule) -> str:
    i = 0
    while hasattr(gm, f"_fl_folded{i}"):
        i += 1
    return f"_fl_folded{i}"
