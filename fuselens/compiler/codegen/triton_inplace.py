"""Which inputs a Triton kernel's output may be written over (`KernelSource.inplace`),
from the loads and stores the kernel printed (`lines`: its body as emitted);
runtime/plan.py takes one that dies at the kernel's call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fuselens.compiler import ir

if TYPE_CHECKING:  # pragma: no cover
    from fuselens.compiler.codegen.triton import TritonKernel


def inplace_candidates(k: "TritonKernel", lines: list[str]) -> dict[str, list[str]]:
    """Inputs the kernel's one output may be written over (runtime/plan.py takes one
    that dies at this call): a 1-D pointwise kernel with a single store, and an input
    of the output's dtype and layout loaded only at the stored element. Its loads all
    feed the stored value (dead loads are dropped), so each element is read before
    the same program overwrites it, whatever the compiler assumes about the two
    pointers: Inductor's `in_out_ptr`. ResNet-50 inference held a third 49 MB
    activation at its peak where a residual add+ReLU could take its input's memory.
    The input may be a view of other sizes over the same memory (runtime/plan.py then
    restrides it): ConvNeXt's GELU reads its Linear's [N, 384] output as [32, 56, 56, 384]
    and held a second 73.5 MB buffer at the step's peak.

    A reduction kernel of one pass over its rows with one full-size store qualifies
    too, when no load of the input is printed after that store: each block of elements
    is read, reduced and stored by one program in one iteration. ViT-B/16's GELU
    backward, with its bias gradient's partial sums, wrote its gradient beside the
    dying incoming gradient and saved fc1 output (36.9 MB each) at the backward's peak."""
    if k.kind == "pointwise" and len(k.writes) == 1:
        o = k.writes[0]
    elif k.kind in ("persistent_reduction", "looped_reduction") and max([0, *k.phase.values()]) == 0:
        full = [w for w in k.writes if w in k.members and k.g.level(k.members[w]) == "full"]
        if len(full) != 1:
            return {}
        o = full[0]
    else:
        return {}
    offs = k.store_offsets.get(o, set())
    if len(offs) != 1 or "broadcast" in offs:
        return {}
    so = k.graph.buffers[o]
    cands = []
    for b in k.reads:
        if b in k.writes or k.load_offsets.get(b) != offs:
            continue
        sb = k.graph.buffers[b]
        if sb.dtype == so.dtype and ir.same_expr(sb.offset, so.offset) and ir.same_memory(sb, so, k.graph.size_hints):
            cands.append(b)
    if cands and k.kind != "pointwise":
        stored = next((i for i, ln in enumerate(lines) if f"tl.store({k.ptr(o, True)} " in ln), len(lines))
        cands = [b for b in cands if not any(f"tl.load({k.ptr(b)} " in ln for ln in lines[stored:])]
    return {o: cands} if cands else {}
