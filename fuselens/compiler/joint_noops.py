"""Copies that change nothing, removed from a joint graph before it is partitioned.

A training graph traces `clone` where a dropout of probability 0, a `.contiguous()` of a
contiguous tensor or an `alias` left a copy with its input's sizes, strides and dtype.
In the joint graph such a copy stands between a value and the ops the partitioner may
recompute from it: Phi's training forward (bf16 autocast) saved each layer norm's
normalized float32 rows for the backward, where Inductor, which removes these copies
first (`remove_noop_ops` in its joint-graph passes), saves the bfloat16 sum they are
computed from and the row statistics: 4 MB above Inductor's step peak on the H200
(forty-first session). A joint graph is functional (a training graph's input mutations
are applied outside it), so a copy's readers may read its input instead, except where
that would make a graph output share memory with an input or another output that
eager returns separately.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq

from fuselens.compiler.joint_cse import storage_of

aten = torch.ops.aten

_COPIES = (aten.clone.default, aten.alias.default)


def _same_layout(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.layout == vb.layout == torch.strided
            and va.dtype == vb.dtype and va.device == vb.device and va.is_conj() == vb.is_conj()
            and va.is_neg() == vb.is_neg() and statically_known_true(sym_eq(va.size(), vb.size()))
            and statically_known_true(sym_eq(va.stride(), vb.stride())))


def drop_noop_copies(graph: torch.fx.Graph) -> int:
    """Remove each clone and alias whose result has its input's layout (the module
    docstring's rule); returns how many went."""
    output = next(iter(reversed(graph.nodes)))
    outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    out_nodes = {o for o in outs if isinstance(o, torch.fx.Node)}
    out_storages = {storage_of(o) for o in out_nodes} - {None}
    in_nodes = set(graph.find_nodes(op="placeholder"))
    in_storages = {storage_of(p) for p in in_nodes} - {None}
    dropped = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _COPIES or node.kwargs.get("memory_format") not in (
                None, torch.preserve_format):
            continue
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or not _same_layout(node, src):
            continue
        mine, theirs = storage_of(node), storage_of(src)
        if mine is None or theirs is None:
            continue
        # an output (or a view of the copy that is one) would share memory with an input or
        # another output
        if mine != theirs and mine in out_storages and (theirs in in_storages or theirs in out_storages):
            continue
        if mine == theirs and node in out_nodes and (src in in_nodes or src in out_nodes):
            continue
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        dropped += 1
    return dropped
