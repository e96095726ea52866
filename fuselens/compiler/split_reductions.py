"""Split reductions: a reduction with few outputs and many inputs per output, as two.

A generated reduction kernel spreads its kept elements over the GPU: one program
per row when the reduced elements are contiguous, one per 64 columns when a kept
dim is (a column reduction). Training BatchNorm reduces N*H*W values for each of C
channels: ResNet-50's first layers keep 64 channels and reduce 100352 values each,
in channels-last a column reduction of one or two programs on a GPU of 132
multiprocessors (0.4 ms a call; 25 of the step's 10.6 ms became kernels of this kind).
The bias gradients of a transformer (a [4096, 768] sum over tokens) are the same case
on a smaller scale.

`split_reductions` rewrites such a reduction over the outer part of its reduced
dims (in memory order; one dim is viewed as two where the split falls inside it):
a first reduction keeps that part and gives enough partial results to fill the
GPU, a second reduces the partials. Sums of 16-bit tensors keep float partials;
a variance is combined from the partial means and M2 sums (Chan's parallel form),
so neither rounds more than eager does. Inductor splits reductions the same way.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Optional

import torch
import torch.fx

from fuselens.compiler.graph_passes import GraphRewrite, _Builder, _fake_mode, _static, _val

aten = torch.ops.aten

COLUMN_LANES = 64  # kept elements one program of a column reduction covers (codegen's MAX_XBLOCK_REDUCTION)
# below this many values per output, or this many in all, a reduction is cheap whatever
# its grid (a split adds a launch). Not 4096: Llama's RMSNorm weight gradient sums 2048
# tokens for each of 1024 columns, with the norm's backward computed on the way in
# (5 tensors read, 2 written): 128 programs of 8 columns, 31 us a call where Inductor's
# split takes 8 (H200).
MIN_REDUCED = 1024
MIN_ELEMENTS = 1 << 20
# ...unless a few programs would each read this many: MobileNetV3's and EfficientNet's
# BatchNorms keep 40 or 80 channels of 28x28 or 14x14 at batch 32 (1.0M and 0.5M values),
# one to five programs: 72 us a call for statistics that take 6 MB of traffic (83 GB/s, H200)
MIN_PER_PROGRAM = 1 << 17
MIN_PARTIAL = 256  # values each partial result reduces, at least
WAVES = 4  # programs to aim for, per multiprocessor

# the overloads over every element (sum.default, mean.default) are split as their dim ones
_AS_DIMS = {aten.sum.default: aten.sum.dim_IntList, aten.mean.default: aten.mean.dim}
_SPLIT = {aten.sum.dim_IntList, aten.mean.dim, aten.var_mean.correction, aten.amax.default, aten.amin.default, *_AS_DIMS}
_EXACT = {aten.amax.default, aten.amin.default}


def split_reductions(gm: torch.fx.GraphModule, sm_count: int) -> list[GraphRewrite]:
    """The rule of the module docstring, for reductions of static shape."""
    mode = _fake_mode(gm)
    if mode is None or sm_count <= 0:
        return []
    done = []
    for node in list(gm.graph.nodes):
        plan = _plan(node, sm_count)
        if plan is None:
            continue
        src, dims, _, parts = plan
        x = _val(src)
        detail = (f"{node.name} ({node.target}) reduces {_reduced(x, dims)} values for each of "
                  f"{_kept(x, dims)} outputs: split in {parts} partial reductions and one over the "
                  "partials, to spread it over the GPU")
        new = _rewrite(_Builder(gm, node, mode), node, *plan)
        if isinstance(new, tuple):  # var_mean: its users are getitems
            for user in list(node.users):
                user.replace_all_uses_with(new[user.args[1]])
                gm.graph.erase_node(user)
        else:
            node.replace_all_uses_with(new)
        done.append(GraphRewrite("split-reduction", node.name, detail))
        gm.graph.erase_node(node)
    if done:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return done


def _reduced(x: torch.Tensor, dims: list[int]) -> int:
    return math.prod(int(x.shape[d]) for d in dims)


def _kept(x: torch.Tensor, dims: list[int]) -> int:
    return math.prod(int(s) for d, s in enumerate(x.shape) if d not in dims)


def _dims_of(node: torch.fx.Node, x: torch.Tensor) -> Optional[list[int]]:
    dims = None if node.target in _AS_DIMS else node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.dim()))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % x.dim() for d in dims}) if x.dim() else None


def _through_merging_view(src: torch.fx.Node, dims: list[int]) -> tuple[torch.fx.Node, list[int]]:
    """The tensor a view merged the reduced dims of, and those dims in it: GPT-2 sums
    its bias gradients over a [8 * 512, 2304] view of [8, 512, 2304]; split inside the
    merged dim, the partials would index the tensor through division and remainder."""
    if src.op != "call_function" or src.target not in (aten.view.default, aten._unsafe_view.default):
        return src, dims
    base = src.args[0]
    bv, vv = _val(base), _val(src)
    if not (isinstance(bv, torch.Tensor) and _static(*bv.shape, *vv.shape)):
        return src, dims
    groups, i = [], 0
    for size in vv.shape:
        group, n = [], 1
        while n < size and i < bv.dim():
            n *= int(bv.shape[i])
            group.append(i)
            i += 1
        if n != size:
            return src, dims  # the view splits a dim: not a merge
        groups.append(group)
    if any(int(bv.shape[j]) != 1 for j in range(i, bv.dim())):
        return src, dims
    return base, sorted(j for d in dims for j in groups[d])


def _plan(node: torch.fx.Node, sm_count: int) -> Optional[tuple[torch.fx.Node, list[int], list[tuple[int, int]], int]]:
    """(the tensor to reduce, its reduced dims, the outer reduced (dim, extent) pairs that
    become partials, how many partials) for a reduction worth splitting, else None."""
    if node.op != "call_function" or node.target not in _SPLIT:
        return None
    if node.target is aten.var_mean.correction and any(u.target is not operator.getitem for u in node.users):
        return None
    x = _val(node.args[0]) if node.args else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not _static(*x.shape, *x.stride()):
        return None
    op = _AS_DIMS.get(node.target, node.target)
    if op not in _EXACT and op is not aten.sum.dim_IntList and x.dtype not in (torch.float32, torch.float64):
        return None  # a 16-bit mean or variance would round its partials
    if op is aten.mean.dim and node.kwargs.get("dtype") not in (None, x.dtype):
        return None
    dims = _dims_of(node, x)
    if not dims:
        return None
    src, dims = _through_merging_view(node.args[0], dims)
    x = _val(src)
    if not _static(*x.stride()):
        return None
    reduced, kept = _reduced(x, dims), _kept(x, dims)
    by_stride = sorted((d for d in range(x.dim()) if x.shape[d] > 1), key=lambda d: (-x.stride(d), -d))
    column = bool(by_stride) and by_stride[-1] not in dims
    programs = max(kept // COLUMN_LANES, 1) if column else kept
    if reduced < MIN_REDUCED or programs >= 2 * sm_count:
        return None
    if reduced * kept < MIN_ELEMENTS and reduced * kept < MIN_PER_PROGRAM * programs:
        return None
    want = min(math.ceil(WAVES * sm_count / programs), reduced // MIN_PARTIAL)
    if want < 2:
        return None
    outer: list[tuple[int, int]] = []
    fallback: Optional[tuple[list[tuple[int, int]], int]] = None  # (outer, got) of the first poor split
    got = 1
    for d in [d for d in by_stride if d in dims]:
        size = int(x.shape[d])
        if got * size <= 2 * want:
            outer.append((d, size))
            got *= size
            if got >= want:
                break
            continue
        part = _divisor_near(size, math.ceil(want / got))
        if 2 * got * part >= want:
            outer.append((d, part))
            got *= part
            break
        # a dim with no divisor near the parts wanted (ViT's 197 tokens are prime) stays
        # whole inside each partial; the partials split a dim further in instead (its batch),
        # unless that gives fewer than splitting this one poorly
        if fallback is None and part > 1:
            fallback = (outer + [(d, part)], got * part)
    if fallback is not None and fallback[1] > got:
        outer, got = fallback
    if got < 2 or got == reduced:
        return None
    return src, dims, outer, got


def _divisor_near(n: int, target: int) -> int:
    """The divisor of n closest to target (the smaller on a tie)."""
    best = 1
    for d in range(1, min(n, 4 * target) + 1):
        if n % d == 0 and abs(d - target) < abs(best - target):
            best = d
    return best


def _rewrite(bld: _Builder, node: torch.fx.Node, src: torch.fx.Node, dims: list[int],
             outer: list[tuple[int, int]], parts: int) -> Any:
    """The split reduction's result: a node, or (var, mean) for var_mean. The final
    view gives eager's shape, with or without the kept dims."""
    x = _val(src)
    shape = [int(s) for s in x.shape]
    # view the dim the split falls inside as (part, rest); dims after it shift by one
    split_dim = next((d for d, e in outer if e != shape[d]), None)
    if split_dim is not None:
        part = dict(outer)[split_dim]
        shape = shape[:split_dim] + [part, shape[split_dim] // part] + shape[split_dim + 1:]
        src = bld.call(aten.view.default, src, shape)

    def moved(d: int) -> int:
        return d + 1 if split_dim is not None and d > split_dim else d

    outer_dims = sorted(moved(d) for d, _ in outer)
    all_dims = sorted({moved(d) for d in dims} | ({split_dim + 1} if split_dim is not None else set()))
    inner_dims = [d for d in all_dims if d not in outer_dims]
    out_shape = list(_val(node)[0].shape if node.target is aten.var_mean.correction else _val(node).shape)
    n_inner = _reduced(x, dims) // parts
    if node.target is aten.var_mean.correction:
        return _split_var_mean(bld, node, src, inner_dims, outer_dims, n_inner, out_shape)
    op = _AS_DIMS.get(node.target, node.target)
    if op is aten.mean.dim:
        partial = bld.call(op, src, inner_dims, True)
        total = bld.call(op, partial, outer_dims, True)
    elif op is aten.sum.dim_IntList:
        out_dtype = node.kwargs.get("dtype") or x.dtype
        acc = torch.float32 if out_dtype in (torch.bfloat16, torch.float16) else out_dtype
        partial = bld.call(op, src, inner_dims, True, dtype=acc)
        total = bld.call(op, partial, outer_dims, True)
        if acc != out_dtype:
            total = bld.call(aten._to_copy.default, total, dtype=out_dtype)
    else:
        partial = bld.call(op, src, inner_dims, True)
        total = bld.call(op, partial, outer_dims, True)
    return bld.call(aten.view.default, total, out_shape)


def _split_var_mean(bld: _Builder, node: torch.fx.Node, src: torch.fx.Node, inner: list[int], outer: list[int],
                    n_inner: int, out_shape: list[int]) -> tuple[torch.fx.Node, torch.fx.Node]:
    """var_mean from partial ones of n_inner values each: M2 = n_inner * (sum of the
    partial variances + sum of squared deviations of the partial means)."""
    correction = node.kwargs.get("correction", 1)
    correction = 1 if correction is None else correction
    pv = bld.call(aten.var_mean.correction, src, inner, correction=0, keepdim=True)
    var_p = bld.call(operator.getitem, pv, 0)
    mean_p = bld.call(operator.getitem, pv, 1)
    mean = bld.call(aten.mean.dim, mean_p, outer, True)
    dev = bld.call(aten.sub.Tensor, mean_p, mean)
    spread = bld.call(aten.add.Tensor, bld.call(aten.sum.dim_IntList, var_p, outer, True),
                      bld.call(aten.sum.dim_IntList, bld.call(aten.mul.Tensor, dev, dev), outer, True))
    total = n_inner * math.prod(int(_val(mean_p).shape[d]) for d in outer)
    var = bld.call(aten.mul.Tensor, spread, n_inner / (total - correction))
    return bld.call(aten.view.default, var, out_shape), bld.call(aten.view.default, mean, out_shape)
