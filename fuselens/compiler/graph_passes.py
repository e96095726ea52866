"""Rewrites of an AOT graph before lowering, each a small named rule.

They change how a graph computes, never what: every rule keeps each node's value
and the layout of every graph output as eager has them, but for one: a padded
matmul's output in an inference graph keeps its padded row stride (a contiguous
copy of GPT-2's logits was 0.28 ms of a 2.1 ms step). Inductor's pad_mm returns the
same strides; views that merge or split leading dims work on them as on eager's. Each rule returns what
it did as `GraphRewrite` records, which the backend reports as fusion decisions.

* `pad_unaligned_matmuls` (GPU, 16-bit): cuBLAS picks its fast Hopper kernels
  only when every operand's leading dimension is a multiple of 16 bytes. A GPT-2
  LM head (vocab 50257) otherwise runs a `cutlass_75 ... align1` kernel, 7x
  slower. Pad the unaligned dims with zeros, multiply, slice the result back
  (Inductor's pad_mm does the same).
* `gather_through_pointwise`: `gather(f(x, row_values), dim, idx)` where `f` is
  pointwise and `row_values` are constant along `dim` is `f(gather(x, dim, idx),
  row_values)`. Cross-entropy gathers one element a row of log_softmax(logits):
  pushed through, the full log_softmax (and the float copy of the logits) is never
  written; only the row reductions read the logits.
* `reshapes_before_pointwise`: `reshape(f(x), shape)` is `f(reshape(x, shape))`
  when `f` is pointwise and `x` is a graph input of its full shape. A causal LM's loss converts the
  `[batch, seq, vocab]` logits to float and views them as `[batch*seq, vocab]`
  before its row reductions: with the view after the conversion the two have
  different iteration spaces and the float copy is written in full (0.4 ms of
  GPT-2's step); with the view first the conversion fuses into the reductions.
* `merge_common_subexpressions` (inference graphs): a node that computes what an
  earlier one computes is dropped for it (joint_cse.py's rule; a training graph's
  joint graph has it before its partition). Every layer of an HF decoder turns the
  one boolean causal mask into the float mask SDPA takes, a kernel a layer; merged,
  the mask is computed once.
* `cats_extend_earlier_cats`: `cat([a, b, ..., y, z])` after `p = cat([a, b, ..., y])`
  on the same dim is `cat([p, z])`. A DenseNet layer concatenates every feature map
  before it: layer k's cat of k parts selects its part at every element, and the
  layers' cats together read k^2/2 parts (DenseNet-121: cats of up to 32 parts). As
  the earlier cat and the new parts, each cat reads two, and an earlier cat that is
  kept anyway (a training forward saves each for its batch norm's backward) is read
  once instead of rebuilt.
* Channels-last convolutions: in layout_passes.py, which also tells AOTAutograd
  the strides of a forward's saved activations.
* `index_put_accumulate_as_index_add`: an embedding's backward accumulates rows
  with index_put, which ATen's CUDA kernel computes by sorting the indices; index_add
  (atomic adds) is what Inductor's generated scatter does. On the CPU (targets/cpp.py)
  ATen's index_add is faster too. An index_put over an outer product of indices (every
  `F.interpolate` backward) becomes an index_add per indexed dim.
* `convolution_bias_as_add` (GPU): ATen's cuDNN convolution adds its bias in a
  kernel of its own after the convolution (`output.add_(bias)`); as an add node it
  joins the kernel of whatever reads the output: ConvNeXt's depthwise convolution
  and the LayerNorm after it, a squeeze-excitation's activation (Inductor splits
  the bias the same way). Eager's values: the convolution's output is rounded to
  its dtype before the bias is added in both.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.fx

aten = torch.ops.aten
prims = torch.ops.prims

ALIGN_BYTES = 16
# Below this many multiply-adds a padded copy costs more than the slow kernel loses.
PAD_MIN_MACS = 1 << 24


@dataclass
class GraphRewrite:
    rule: str  # "pad-matmul", "gather-through-pointwise"
    node: str  # the FX node rewritten
    detail: str  # what changed, in a user's words
    applied: bool = True  # False: the rule declined this graph, and `detail` says why


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else n


def _fake_mode(gm: torch.fx.GraphModule) -> Any:
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in gm.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return detect_fake_mode(vals)


class _Builder:
    """Inserts nodes before `anchor`, each with its fake value computed from its inputs'."""

    def __init__(self, gm: torch.fx.GraphModule, anchor: torch.fx.Node, mode: Any) -> None:
        self.gm, self.anchor, self.mode = gm, anchor, mode

    def call(self, target: Callable, *args: Any, **kwargs: Any) -> torch.fx.Node:
        with self.gm.graph.inserting_before(self.anchor):
            node = self.gm.graph.call_function(target, args, kwargs)
        fake_args = torch.fx.node.map_arg(args, _val)
        fake_kwargs = torch.fx.node.map_arg(kwargs, _val)
        with self.mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        for key in ("stack_trace", "original_aten"):
            if key in self.anchor.meta:
                node.meta[key] = self.anchor.meta[key]
        return node


def _static(*xs: Any) -> bool:
    return all(isinstance(x, int) for x in xs)


def _ld_dims(t: torch.Tensor) -> Optional[int]:
    """A 2-D operand's layout: 1 for row-major (strides (ld, 1)), 0 for column-major
    (strides (1, ld)); None for other layouts, which are left alone."""
    if t.stride(1) == 1:
        return 1
    if t.stride(0) == 1:
        return 0
    return None


def _unaligned(n: int, dtype: torch.dtype) -> bool:
    return (n * dtype.itemsize) % ALIGN_BYTES != 0


def _padded(n: int, dtype: torch.dtype) -> int:
    per = ALIGN_BYTES // dtype.itemsize
    return -(-n // per) * per


def _pad_2d(bld: _Builder, x: torch.fx.Node, ld_dim: int, rows: int, cols: int,
            made: dict[tuple, torch.fx.Node]) -> torch.fx.Node:
    """`x` with `rows` zero rows and `cols` zero columns appended, padded in its memory
    order: a column-major operand (a transposed weight, a transposed gradient) is padded
    as its transpose and transposed back, a coalesced copy instead of a transposing one.
    `made` holds the pads made so far: a logits gradient feeds two matmuls of the
    backward (once transposed), and one padded copy serves both."""
    if ld_dim == 1:
        return _pad_once(bld, x, [0, cols, 0, rows], made)
    base = x.args[0] if _is_transpose(x) else bld.call(aten.permute.default, x, [1, 0])
    return bld.call(aten.permute.default, _pad_once(bld, base, [0, rows, 0, cols], made), [1, 0])


def _is_transpose(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and (n.target is aten.t.default or (
        n.target is aten.permute.default and list(n.args[1]) == [1, 0]))


def _pad_once(bld: _Builder, x: torch.fx.Node, pad: list[int], made: dict[tuple, torch.fx.Node]) -> torch.fx.Node:
    key = (x, tuple(pad))
    if key not in made:
        made[key] = bld.call(aten.constant_pad_nd.default, x, pad)
    return made[key]


def _matmul_operands(node: torch.fx.Node, require_cuda: bool) -> Optional[tuple]:
    """(bias or None, a, b) of a 16-bit mm or addmm this rule may pad."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default) or node.kwargs:
        return None
    if node.target is aten.addmm.default and len(node.args) > 3:
        return None
    bias, a, b = (None, *node.args) if node.target is aten.mm.default else node.args[:3]
    va, vb, out = _val(a), _val(b), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (va, vb, out)) or (require_cuda and not va.is_cuda):
        return None
    if va.dtype not in (torch.bfloat16, torch.float16) or vb.dtype != va.dtype:
        return None
    return bias, a, b


def pad_unaligned_matmuls(gm: torch.fx.GraphModule, *, require_cuda: bool = True,
                          padded_outputs: bool = False) -> list[GraphRewrite]:
    """The rule of the module docstring, for mm and addmm with a 1-D bias
    (`require_cuda=False` lets tests run it on CPU graphs). `padded_outputs`: a graph
    output may keep the padded row stride (inference graphs: their outputs are the
    user's only; a training forward's outputs also feed a backward traced on eager's
    layouts)."""
    mode = _fake_mode(gm)
    done: list[GraphRewrite] = []
    touched = False
    if mode is None:
        return done
    made: dict[tuple, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        operands = _matmul_operands(node, require_cuda)
        if operands is None:
            continue
        bias, a, b = operands
        va, vb = _val(a), _val(b)
        (m, k), n = va.shape, vb.shape[1]
        if not _static(m, k, n) or m * k * n < PAD_MIN_MACS:
            continue
        if bias is not None and (not isinstance(_val(bias), torch.Tensor) or _val(bias).dim() != 1):
            continue
        la, lb = _ld_dims(va), _ld_dims(vb)
        if la is None or lb is None:
            continue
        dt = va.dtype
        pad_m = _unaligned(m, dt) and la == 0  # A column-major: its ld is M
        pad_k = _unaligned(k, dt) and (la == 1 or lb == 0)
        pad_n = _unaligned(n, dt)  # the output's ld, and B's when row-major
        if not (pad_m or pad_k or pad_n):
            continue
        mp, kp, np_ = (_padded(m, dt) if pad_m else m), (_padded(k, dt) if pad_k else k), (_padded(n, dt) if pad_n else n)
        bld = _Builder(gm, node, mode)
        touched = True
        pa = _pad_2d(bld, a, la, mp - m, kp - k, made) if (pad_m or pad_k) else a
        pb = _pad_2d(bld, b, lb, kp - k, np_ - n, made) if (pad_k or pad_n) else b
        if bias is None:
            prod = bld.call(aten.mm.default, pa, pb)
        else:
            pbias = bld.call(aten.constant_pad_nd.default, bias, [0, np_ - n]) if pad_n else bias
            prod = bld.call(aten.addmm.default, pbias, pa, pb)
        res = prod
        if pad_m:
            res = bld.call(aten.slice.Tensor, res, 0, 0, m)
        if pad_n:
            res = bld.call(aten.slice.Tensor, res, 1, 0, n)
        if not _replace_keeping_layouts(gm, node, res, mode, padded_rows_ok=padded_outputs):
            continue  # the unused padded nodes go with eliminate_dead_code below
        done.append(GraphRewrite("pad-matmul", node.name, f"{m}x{k} @ {k}x{n} padded to {mp}x{kp} @ {kp}x{np_} "
                                 f"(16-byte aligned leading dimensions: cuBLAS's fast kernels)"))
    if touched:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
          aten.t.default, aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim, aten.expand.default,
          aten.slice.Tensor, aten.select.int, aten.alias.default}


def _replace_keeping_layouts(gm: torch.fx.GraphModule, old: torch.fx.Node, new: torch.fx.Node, mode: Any,
                             padded_rows_ok: bool = False) -> bool:
    """Use `new` (same values, other strides) for `old`. The fake values of the views
    of it are re-derived; a graph output whose strides would change gets a contiguous
    copy, unless `padded_rows_ok` and only its row strides grew (see the module
    docstring). False, with nothing changed, when a view cannot be expressed on the
    new strides or an output of eager's was not contiguous."""
    if tuple(_val(new).stride()) == tuple(_val(old).stride()):
        old.replace_all_uses_with(new)
        return True
    newval: dict[torch.fx.Node, Any] = {old: _val(new)}
    views: list[torch.fx.Node] = []
    stack = [old]
    while stack:
        o = stack.pop()
        for user in o.users:
            if user.op != "call_function" or user.target not in _VIEWS:
                continue
            args = torch.fx.node.map_arg(user.args, lambda a: newval.get(a, _val(a)))
            try:
                with mode:
                    newval[user] = user.target(*args, **torch.fx.node.map_arg(user.kwargs, _val))
            except Exception:  # noqa: BLE001 - the new strides cannot be viewed this way
                return False
            views.append(user)
            stack.append(user)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    restride = [n for n in [old] + views
                if n in out.all_input_nodes and tuple(newval[n].stride()) != tuple(_val(n).stride())
                and not (padded_rows_ok and _padded_rows(_val(n), newval[n]))]
    if any(not _val(n).is_contiguous() for n in restride):
        return False
    old.replace_all_uses_with(new)
    for v in views:
        v.meta["val"] = newval[v]
    for n in restride:
        src = new if n is old else n
        copy = _Builder(gm, out, mode).call(aten.clone.default, src, memory_format=torch.contiguous_format)
        out.replace_input_with(src, copy)
    return True


def _padded_rows(eager: torch.Tensor, padded: torch.Tensor) -> bool:
    """A contiguous tensor and the same sizes with a padded last-dim row: unit stride
    innermost, each outer stride its inner neighbour's extent or more, in the same order."""
    if not eager.is_contiguous() or eager.dim() < 2 or padded.stride(-1) != 1:
        return False
    for d in range(eager.dim() - 1):
        if padded.stride(d) < padded.stride(d + 1) * padded.shape[d + 1]:
            return False
    return True


_MAX_PUSH_DEPTH = 16


def _pointwise(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if node.target in (prims.convert_element_type.default,):
        return True
    if node.target is aten._to_copy.default:  # a dtype change on the same device, no layout change
        src, kw = _val(node.args[0]), node.kwargs
        return (isinstance(src, torch.Tensor) and set(kw) <= {"dtype", "layout", "device", "pin_memory", "memory_format"}
                and kw.get("device", src.device) == src.device and kw.get("layout", torch.strided) == torch.strided
                and kw.get("memory_format") in (None, torch.preserve_format))
    return torch.Tag.pointwise in node.target.tags and isinstance(_val(node), torch.Tensor)


def _push_gather(bld: _Builder, src: Any, dim: int, idx: torch.fx.Node, depth: int) -> Optional[torch.fx.Node]:
    """`gather(src, dim, idx)` computed from gathers of `src`'s pointwise inputs, or
    None when `src` is not a pointwise op whose operands allow it."""
    if not isinstance(src, torch.fx.Node) or depth > _MAX_PUSH_DEPTH:
        return None
    if src.op == "call_function" and src.target in _RESHAPES:
        sunk = _sink_reshape(bld, src)
        return _push_gather(bld, sunk, dim, idx, depth + 1) if sunk is not None else None
    if not _pointwise(src):
        return None
    full = tuple(_val(src).shape)
    gathered_shape = tuple(_val(idx).shape)
    if len(gathered_shape) != len(full) or any(gathered_shape[d] != full[d] for d in range(len(full)) if d != dim):
        return None

    def operand(a: Any) -> Any:
        v = _val(a)
        if not isinstance(a, torch.fx.Node) or not isinstance(v, torch.Tensor) or v.dim() == 0:
            return a  # a scalar is the same at every position
        if tuple(v.shape) == full:
            return _push_gather(bld, a, dim, idx, depth + 1) or bld.call(aten.gather.default, a, dim, idx)
        if v.dim() == len(full) and v.shape[dim] == 1 and all(v.shape[d] in (1, full[d]) for d in range(len(full))):
            return a  # constant along `dim`: every gathered position reads the same value
        raise _CannotPush

    try:
        args = torch.fx.node.map_arg(src.args, operand)
    except _CannotPush:
        return None
    return bld.call(src.target, *args, **src.kwargs)


class _CannotPush(Exception):
    pass


_RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def _sink_reshape(bld: _Builder, view: torch.fx.Node) -> Optional[torch.fx.Node]:
    """`reshape(f(x, y), shape)` as `f(reshape(x, shape), reshape(y, shape))` for a
    pointwise `f` whose tensor operands all have its full shape (cross-entropy's
    `logits.float().view(-1, vocab)`), so a gather can pass the reshape; None otherwise."""
    inner = view.args[0]
    if not isinstance(inner, torch.fx.Node) or not _pointwise(inner):
        return None
    full = tuple(_val(inner).shape)

    def operand(a: Any) -> Any:
        v = _val(a)
        if not isinstance(a, torch.fx.Node) or not isinstance(v, torch.Tensor) or v.dim() == 0:
            return a
        if tuple(v.shape) != full:
            raise _CannotPush
        return bld.call(view.target, a, *view.args[1:])

    try:
        args = torch.fx.node.map_arg(inner.args, operand)
        return bld.call(inner.target, *args, **inner.kwargs)
    except Exception:  # noqa: BLE001 - _CannotPush, or an operand whose strides cannot be viewed
        return None


def gather_through_pointwise(gm: torch.fx.GraphModule) -> list[GraphRewrite]:
    """The rule of the module docstring."""
    mode = _fake_mode(gm)
    done: list[GraphRewrite] = []
    if mode is None:
        return done
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.gather.default or node.kwargs.get("sparse_grad"):
            continue
        src, dim, idx = node.args[:3]
        if not isinstance(idx, torch.fx.Node) or not isinstance(_val(src), torch.Tensor):
            continue
        dim = dim % _val(src).dim()
        new = _push_gather(_Builder(gm, node, mode), src, dim, idx, 0)
        if new is None:
            continue
        node.replace_all_uses_with(new)
        done.append(GraphRewrite("gather-through-pointwise", node.name,
                                 f"gathers the inputs of {src.name} ({src.target}) instead of its full result, "
                                 "which then need not be written"))
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


def reshapes_before_pointwise(gm: torch.fx.GraphModule) -> list[GraphRewrite]:
    """The rule of the module docstring, where the pointwise op reads graph inputs
    only and its only user is the reshape (no work is duplicated)."""
    mode = _fake_mode(gm)
    done: list[GraphRewrite] = []
    if mode is None:
        return done
    changed = True
    while changed:  # a chain of pointwise ops: the reshape moves up one op a round
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in _RESHAPES:
                continue
            inner = node.args[0]
            if not isinstance(inner, torch.fx.Node) or len(inner.users) != 1 or not _pointwise(inner):
                continue
            operands = [a for a in inner.args if isinstance(a, torch.fx.Node) and isinstance(_val(a), torch.Tensor)
                        and _val(a).dim() > 0]
            # only over graph inputs, whose view is free: inside a model, moving a reshape
            # between fused ops changes nothing but can split a kernel (measured on GPT-2)
            if not operands or any(a.op != "placeholder" for a in operands):
                continue
            sunk = _sink_reshape(_Builder(gm, node, mode), node)
            if sunk is None or tuple(_val(sunk).shape) != tuple(_val(node).shape):
                continue
            if tuple(_val(sunk).stride()) != tuple(_val(node).stride()):
                continue  # another layout than eager's: leave it
            node.replace_all_uses_with(sunk)
            gm.graph.erase_node(node)
            gm.graph.erase_node(inner)
            done.append(GraphRewrite("reshape-before-pointwise", node.name,
                                     f"{node.name} reshapes the inputs of {inner.name} ({inner.target}) instead of "
                                     "its result, so it runs in the shape its consumers iterate"))
            changed = True
    if done:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return done


def merge_common_subexpressions(gm: torch.fx.GraphModule) -> list[GraphRewrite]:
    """The graph with each node that computes what an earlier node computes dropped for it."""
    from fuselens.compiler.joint_cse import cse

    merged: list[tuple[str, str]] = []
    graph = cse(gm.graph, merged)
    if not merged:
        return []
    gm.graph = graph
    return [GraphRewrite("common-subexpression", dropped, f"{dropped} computes what {kept} computes: merged into it")
            for dropped, kept in merged]


def cats_extend_earlier_cats(gm: torch.fx.GraphModule) -> list[GraphRewrite]:
    """The rule of the module docstring, with the longest earlier cat of the same
    leading parts (at least two) on the same dim; a cat whose result would take
    other strides than eager's is left."""
    mode = _fake_mode(gm)
    done: list[GraphRewrite] = []
    if mode is None:
        return done
    earlier: dict[tuple, torch.fx.Node] = {}  # (dim, its parts as written) -> that cat
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.cat.default:
            continue
        parts = list(node.args[0])
        val = _val(node)
        if not isinstance(val, torch.Tensor) or val.dim() == 0 or not _static(*val.shape, *val.stride()):
            continue  # symbolic strides: comparing them would guard on the sizes
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % val.dim()
        earlier[(dim, tuple(parts))] = node
        n_prefix = next((n for n in range(len(parts) - 1, 1, -1) if (dim, tuple(parts[:n])) in earlier), 0)
        if not n_prefix:
            continue
        prefix, rest = earlier[(dim, tuple(parts[:n_prefix]))], parts[n_prefix:]
        with mode:
            new = aten.cat.default([_val(prefix)] + [_val(r) for r in rest], dim)
        if tuple(new.stride()) != tuple(val.stride()):
            continue
        node.args = ([prefix] + rest, dim)
        done.append(GraphRewrite("cat-extends-cat", node.name,
                                 f"{node.name} concatenates {prefix.name} and {len(rest)} more part(s) instead of "
                                 f"its {len(parts)} parts: {prefix.name} holds the first {n_prefix} already"))
    if done:
        gm.recompile()
    return done


def index_put_accumulate_as_index_add(gm: torch.fx.GraphModule, *, require_cuda: bool = True) -> list[GraphRewrite]:
    """`index_put(x, [idx], v, accumulate=True)` (an embedding's backward) as
    `index_add(x, 0, idx, v)`: ATen's CUDA index_put with accumulate sorts the
    indices to sum duplicates deterministically (BERT's word-embedding gradient:
    1.96 ms a step on the H100); index_add sums them with atomics, as Inductor's
    generated scatter does. Not under torch.use_deterministic_algorithms."""
    if torch.are_deterministic_algorithms_enabled():
        return []
    mode = _fake_mode(gm)
    done: list[GraphRewrite] = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.index_put.default:
            continue
        x, indices, values = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        xv, vv = _val(x), _val(values)
        if accumulate is not True or not isinstance(indices, (list, tuple)):
            continue
        if len(indices) != 1 or indices[0] is None:
            new = _separable_index_add(gm, mode, node, require_cuda)
            if new is not None:
                done.append(GraphRewrite("index-add", node.name, f"{node.name}: index_put with accumulate=True "
                                         "over an outer product of indices runs as an index_add per indexed dim"))
            continue
        idx = indices[0]
        iv = _val(idx)
        if not (isinstance(iv, torch.Tensor) and isinstance(xv, torch.Tensor) and isinstance(vv, torch.Tensor)):
            continue
        if iv.dtype not in (torch.int64, torch.int32) or (require_cuda and not xv.is_cuda) or xv.dim() < 1 or vv.dtype != xv.dtype:
            continue
        if not _static(*iv.shape, *vv.shape, *xv.shape):
            continue  # comparing symbolic sizes would specialize the graph on them
        rows = list(vv.shape[iv.dim():])
        if list(vv.shape[:iv.dim()]) != list(iv.shape) or rows != list(xv.shape[1:]):
            continue
        bld = _Builder(gm, node, mode)
        flat = bld.call(aten.reshape.default, idx, [-1])
        # index_put wraps negative indices; index_add does not
        wrapped = bld.call(aten.where.self, bld.call(aten.lt.Scalar, flat, 0),
                           bld.call(aten.add.Scalar, flat, xv.shape[0]), flat)
        src = bld.call(aten.reshape.default, values, [-1] + rows)
        new = bld.call(aten.index_add.default, x, 0, wrapped, src)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done.append(GraphRewrite("index-add", node.name, f"{node.name}: index_put with accumulate=True "
                                 "runs as index_add (atomic adds instead of ATen's sort of the indices)"))
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _separable_index_add(gm: torch.fx.GraphModule, mode: Any, node: torch.fx.Node,
                         require_cuda: bool) -> Optional[torch.fx.Node]:
    """`index_put(x, [None, .., i0, i1, ..], v, accumulate=True)` whose indices form an outer
    product (index j varies along its own dim of their broadcast shape only: [H', 1] and
    [W'], what every `F.interpolate` backward scatters with) as an index_add along each
    indexed dim in turn, the last one into x. ATen ran it in one kernel of its own (on the
    GPU, after sorting the indices); index_add is a library call that sums with atomics.
    Sums in another order than index_put's: equal within rounding. None where the pattern
    does not hold; the node is replaced where it does."""
    x, indices, values = node.args[:3]
    xv, vv = _val(x), _val(values)
    present = [k for k, i in enumerate(indices) if i is not None]
    if not present or present != list(range(present[0], present[0] + len(present))):
        return None  # indices apart put the indexed dims first: not this pattern
    ivs = [_val(indices[k]) for k in present]
    if not (isinstance(xv, torch.Tensor) and isinstance(vv, torch.Tensor)
            and all(isinstance(iv, torch.Tensor) for iv in ivs)):
        return None
    if (require_cuda and not xv.is_cuda) or vv.dtype != xv.dtype or any(
            iv.dtype not in (torch.int64, torch.int32) for iv in ivs):
        return None
    if not xv.is_contiguous():
        return None  # index_add's result is contiguous, index_put's has x's layout
    if not _static(*xv.shape, *vv.shape, *(d for iv in ivs for d in iv.shape)):
        return None
    k, first = len(ivs), present[0]
    if any(iv.dim() > k for iv in ivs):
        return None
    shapes = [[1] * (k - iv.dim()) + list(iv.shape) for iv in ivs]
    spread = [max(sh[j] for sh in shapes) for j in range(k)]
    for j, sh in enumerate(shapes):  # index j spans dim j of the broadcast shape, and only it
        if any(n != 1 for d, n in enumerate(sh) if d != j) or sh[j] not in (1, spread[j]):
            return None
    if list(vv.shape) != list(xv.shape[:first]) + spread + list(xv.shape[first + k:]):
        return None
    bld = _Builder(gm, node, mode)
    # 16-bit sums in float, rounded once at the end, as ATen's index_put sums (an atomic add
    # of a 16-bit type rounds at every add)
    work = torch.float32 if xv.dtype in (torch.float16, torch.bfloat16) else xv.dtype
    acc: Any = values if work == xv.dtype else bld.call(aten._to_copy.default, values, dtype=work)
    shape = list(vv.shape)
    for j in reversed(range(k)):
        dim = first + j
        flat = bld.call(aten.reshape.default, indices[present[j]], [-1])
        if shapes[j][j] != spread[j]:  # one index for every position along this dim
            flat = bld.call(aten.expand.default, flat, [spread[j]])
        n = xv.shape[dim]
        wrapped = bld.call(aten.where.self, bld.call(aten.lt.Scalar, flat, 0), bld.call(aten.add.Scalar, flat, n), flat)
        shape[dim] = n
        if j > 0:
            into = bld.call(aten.zeros.default, list(shape), dtype=work, device=xv.device)
        else:  # the last into x
            into = x if work == xv.dtype else bld.call(aten._to_copy.default, x, dtype=work)
        acc = bld.call(aten.index_add.default, into, dim, wrapped, acc)
    if work != xv.dtype:
        acc = bld.call(aten._to_copy.default, acc, dtype=xv.dtype)
    node.replace_all_uses_with(acc)
    gm.graph.erase_node(node)
    return acc


def convolution_bias_as_add(gm: torch.fx.GraphModule, *, require_cuda: bool = True) -> list[GraphRewrite]:
    """The rule of the module docstring (`require_cuda=False` lets tests run it on CPU graphs)."""
    mode = _fake_mode(gm)
    done: list[GraphRewrite] = []
    if mode is None:
        return done
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default or node.kwargs \
                or len(node.args) != 9 or node.args[2] is None:
            continue
        out, bias = _val(node), _val(node.args[2])
        if not (isinstance(out, torch.Tensor) and isinstance(bias, torch.Tensor)) or bias.dim() != 1 \
                or (require_cuda and not out.is_cuda) or bias.dtype != out.dtype:
            continue
        bld = _Builder(gm, node, mode)
        conv = bld.call(aten.convolution.default, node.args[0], node.args[1], None, *node.args[3:])
        per_channel = bld.call(aten.view.default, node.args[2], [1, -1] + [1] * (out.dim() - 2))
        added = bld.call(aten.add.Tensor, conv, per_channel)
        if _val(added).stride() != out.stride():  # a layout eager's add would not give: leave it whole
            for n in (added, per_channel, conv):
                gm.graph.erase_node(n)
            continue
        node.replace_all_uses_with(added)
        gm.graph.erase_node(node)
        done.append(GraphRewrite("conv-bias-add", node.name, f"{node.name}: the convolution's bias is added by the "
                                 "kernel that reads its output (cuDNN's path adds it in a kernel of its own)"))
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
