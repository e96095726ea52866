"""Which inputs a Triton kernel's output may be written over (`KernelSource.inplace`),
from the loads and stores the kernel printed (`lines`: its body as emitted);
runtime/plan.py takes one that dies at the kernel's call."""

from __future__ import annotations

import collections
import re
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
    if k.kind == "pointwise" and len(k.writes) > 1:
        return _each_output(k, lines)
    if k.kind == "pointwise" and len(k.writes) == 1:
        o = k.writes[0]
    elif k.kind in ("persistent_reduction", "looped_reduction") and max([0, *k.phase.values()]) == 0:
        full = [w for w in k.writes if w in k.members and k.g.level(k.members[w]) == "full"]
        if len(full) != 1:
            return {}
        o = full[0]
    else:
        return {}
    cands = _same_elements(k, o)
    if cands and k.kind != "pointwise":
        stored = next((i for i, ln in enumerate(lines) if f"tl.store({k.ptr(o, True)} " in ln), len(lines))
        cands = [b for b in cands if not any(f"tl.load({k.ptr(b)} " in ln for ln in lines[stored:])]
    return {o: cands} if cands else {}


def _same_elements(k: "TritonKernel", o: str) -> list[str]:
    """Inputs of output `o`'s dtype and memory, loaded only at the elements `o` stores."""
    offs = k.store_offsets.get(o, set())
    if len(offs) != 1 or "broadcast" in offs:
        return []
    so = k.graph.buffers[o]
    cands = []
    for b in k.reads:
        if b in k.writes or k.load_offsets.get(b) != offs:
            continue
        sb = k.graph.buffers[b]
        if sb.dtype == so.dtype and ir.same_expr(sb.offset, so.offset) and ir.same_memory(sb, so, k.graph.size_hints):
            cands.append(b)
    return cands


_TMP = re.compile(r"\btmp\d+\b")
_LOAD = re.compile(r"tl\.load\((\w+) ")


def _each_output(k: "TritonKernel", lines: list[str]) -> dict[str, list[str]]:
    """A pointwise kernel of several outputs: each may be written over an input whose
    every load feeds that output's stored value, so the program reads the element before
    it overwrites it, however the compiler orders the other outputs' work (it may assume
    two pointer arguments never alias). DenseNet's backward adds each dense layer's
    gradient slice to the running gradients of all earlier layers in one kernel: up to
    23 outputs, each the sum of a dying buffer of its size (300 fresh buffers a step on
    the H200, where the step is host-bound)."""
    made: dict[str, set[str]] = {}  # tmp -> the tmps its expression reads
    loads: dict[str, list[str]] = {}  # pointer argument -> the tmps loaded from it (a load inside
    # an expression is in none: an input loaded so is no candidate)
    stored: dict[str, set[str]] = {}  # pointer argument -> the tmps its stored value reads
    loaded: collections.Counter[str] = collections.Counter()  # pointer argument -> its loads anywhere in the body
    for ln in lines:
        text = ln.strip()
        loaded.update(_LOAD.findall(text))
        m = re.match(r"(tmp\d+) = (.*)$", text)
        if m:
            made[m.group(1)] = set(_TMP.findall(m.group(2)))
            load = _LOAD.match(m.group(2))
            if load:
                loads.setdefault(load.group(1), []).append(m.group(1))
            continue
        if text.startswith("tl.store(") and text.endswith(")"):
            args = _top_level_args(text[len("tl.store("):-1])
            ptr = args[0].split(" ", 1)[0]
            stored[ptr] = set() if ptr in stored or len(args) < 2 else set(_TMP.findall(args[1]))  # twice: not judged
    out: dict[str, list[str]] = {}
    for o in k.writes:
        value = stored.get(k.ptr(o, True))
        if not value:
            continue
        feeds, todo = set(value), list(value)
        while todo:
            for t in made.get(todo.pop(), ()):
                if t not in feeds:
                    feeds.add(t)
                    todo.append(t)
        cands = [b for b in _same_elements(k, o) if loads.get(k.ptr(b)) and set(loads[k.ptr(b)]) <= feeds
                 and loaded[k.ptr(b)] == len(loads[k.ptr(b)])]
        if cands:
            out[o] = cands
    return out


def _top_level_args(text: str) -> list[str]:
    """`a + (b, c), d, e` -> its comma-separated parts outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts
