"""A kernel of the scheduler's making (`KernelGroup`), the loop space it iterates, and
the words its decisions use (a member's label, why it joined, the kernel's name). The
scheduler (scheduler.py) grows kernels; the code generators read them.

A kernel (`KernelGroup`) iterates one space: a "full" shape (the squeezed sizes
of its pointwise nodes / the inputs of its reductions) of which some dims may be
reduced. Its members are *full-level* nodes (one value per full index: pointwise
chains, reduction prologues, row-wise epilogues such as softmax's division) and
*outer-level* nodes (one value per kept index: reductions and what follows them,
such as layernorm's rsqrt(var + eps)). The code generator turns a row kernel into
an outer parallel loop with one inner pass per reduction dependency level.

A node runs in a kernel's loop when its sizes are the loop's, or the same elements with
dims merged or split (a view between them: `lines_up`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import sympy

from fuselens.compiler import ir
from fuselens.compiler.ir import ComputeNode, Expr, ExternNode


@dataclass(eq=False)
class KernelGroup:
    """One generated kernel."""

    nodes: list[ComputeNode]
    full: list[Expr]  # squeezed iteration space
    rflags: Optional[list[bool]] = None  # which full dims are reduced; None: no reduction yet
    name: str = ""
    stores: set[str] = field(default_factory=set)  # members written to memory
    reasons: list[str] = field(default_factory=list)  # why members joined, in order
    order: int = 0  # position of the first member in the graph

    @property
    def has_reduction(self) -> bool:
        return self.rflags is not None

    def outer(self) -> list[Expr]:
        if self.rflags is None:
            return list(self.full)
        return [s for s, r in zip(self.full, self.rflags) if not r]

    def names(self) -> set[str]:
        return {n.name for n in self.nodes}

    def fx_nodes(self) -> list[str]:
        seen: list[str] = []
        for n in self.nodes:
            for f in n.fx_nodes:
                if f not in seen:
                    seen.append(f)
        return seen

    def level(self, node: ComputeNode) -> str:
        """"full", "outer" or "reduction" (computed in the inner loop, a value per outer index)."""
        if node.is_reduction:
            return "reduction"
        if self.rflags is None or fills(tuple(node.size), tuple(self.full)):
            return "full"
        return "outer"

    def gvars(self) -> list[sympy.Symbol]:
        return [ir.index_var("g", d) for d in range(len(self.full))]

    def full_index(self, size: Sequence[Expr]) -> list[Expr]:
        """The index of a full-level node (or a reduction's input) at the group's variables;
        a node whose dims merge or split the group's is reindexed (ir.reindex)."""
        return index_in(self.full, self.gvars(), size)

    def outer_index(self, size: Sequence[Expr]) -> list[Expr]:
        g = self.gvars()
        keep = [d for d in range(len(self.full)) if not (self.rflags and self.rflags[d])]
        return index_in([self.full[d] for d in keep], [g[d] for d in keep], size)

    def own_index(self, node: ComputeNode) -> list[Expr]:
        lvl = self.level(node)
        return self.full_index(node.size) if lvl == "full" else self.outer_index(node.size)

    def ranges(self) -> dict:
        return dict(zip(self.gvars(), self.full))


# asked for every member of every candidate kernel (ResNet-50 training: 27816 times)
@functools.lru_cache(maxsize=16384)
def fills(size: tuple, full: tuple) -> bool:
    """Whether a node of `size` has as many elements as the loop space `full`."""
    return ir.same_expr(ir.numel(ir.squeeze(size)), ir.numel(full))


def index_in(space: Sequence[Expr], variables: Sequence[sympy.Symbol], size: Sequence[Expr]) -> list[Expr]:
    if ir.same_sizes(ir.squeeze(size), space):
        it = iter(variables)
        return [sympy.Integer(0) if s == 1 else next(it) for s in size]
    index = ir.reindex(space, variables, size)
    if index is None:  # rule_iteration_space admits no such member
        raise AssertionError(f"{ir.format_sizes(size)} does not line up with the loop over {ir.format_sizes(space)}")
    return index


def space_key(g: KernelGroup) -> tuple:
    """A kernel's loop space as a dict key."""
    return tuple(g.full), tuple(g.rflags) if g.rflags is not None else None


def lines_up(space: Sequence[Expr], size: Sequence[Expr]) -> bool:
    """Whether a pointwise node over `size` can run in a loop over `space`: the same
    sizes, or the same elements with dims merged or split (a view between them)."""
    if ir.same_sizes(ir.squeeze(size), space):
        return True
    return ir.reindex(space, [ir.index_var("g", d) for d in range(len(space))], size) is not None


def loop_space(node: ComputeNode) -> tuple[list[Expr], Optional[list[bool]]]:
    if node.is_reduction:
        full = [s for s in node.full_size if s != 1]
        rflags = [d in node.rdims for d, s in enumerate(node.full_size) if s != 1]
        return full, rflags
    return ir.squeeze(node.size), None


def fmt_sizes(sizes: Sequence[Expr]) -> str:
    return ir.format_sizes(sizes)


def mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 1024:.0f} KB"


def same_space(g: KernelGroup, n: ComputeNode) -> bool:
    full, rflags = loop_space(n)
    return ir.same_sizes(full, g.full) and (rflags == g.rflags or (not n.is_reduction and g.rflags is None))


def label(s: Any) -> str:
    if isinstance(s, ComputeNode):
        return f"{s.fx_nodes[0]} ({s.aten_ops[0]})"
    if isinstance(s, ExternNode):
        return f"{s.name} ({s.fx_node.target})"
    return str(s)


def join_reason(g: KernelGroup, n: ComputeNode) -> str:
    lvl = g.level(n)
    if n.is_reduction:
        if g.rflags is None:
            return (f"{label(n)}: its pointwise producers become the reduction's prologue "
                    f"(same {fmt_sizes(g.full)} rows)")
        return f"{label(n)}: another reduction over the same rows of {fmt_sizes(g.full)}, in the same row pass"
    if g.rflags is None:
        return f"{label(n)}: pointwise over the same {fmt_sizes(g.full)} iteration space"
    if lvl == "outer":
        return f"{label(n)}: pointwise on the reduced values ({fmt_sizes(g.outer())}), epilogue of the row pass"
    return f"{label(n)}: pointwise over the rows after the reduction (epilogue, one more pass over each row)"


def _short(op: str) -> str:
    name = op.split(".")[1] if op.startswith(("aten.", "prims.", "fuselens.")) else op
    return name.strip("_").replace("convert_element_type", "convert")


def kernel_name(g: KernelGroup, counter: int, prefix: str) -> str:
    ops = sorted({_short(o) for n in g.nodes for o in n.aten_ops})
    label = "_".join(ops[:6]) + ("_etc" if len(ops) > 6 else "")
    return f"{prefix}_{label}_{counter}"


