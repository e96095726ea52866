"""Combo kernels in Triton (compiler/combo_kernels.py): the parts of a ComboGroup, each a
1-D pointwise kernel of static sizes printed by `TritonKernel`, in one `@triton.jit`
function, each on its own range of program ids."""

from __future__ import annotations

from typing import Any

import sympy

from fuselens.compiler.codegen import cname
from fuselens.compiler.codegen.triton import _LONG_MATH, TritonKernel, TritonKernelSource
from fuselens.compiler.codegen.triton_inplace import inplace_candidates
from fuselens.compiler.combo_kernels import ComboGroup
from fuselens.compiler.ir import GraphIR
from fuselens.compiler.kernel_group import KernelGroup


def combo_part(group: KernelGroup, graph: GraphIR, options: Any) -> bool:
    """Whether `group` can be a part of a combo kernel (compiler/combo_kernels.py): a 1-D
    pointwise kernel of static sizes, whose part of the grid is known when it is printed.
    Planned, not printed: this is asked of every kernel of an optimizer step's graph."""
    if group.rflags is not None or graph.symbols:
        return False
    with TritonKernel(group, graph, options) as k:
        k.plan()
        return k.kind == "pointwise" and k.xnumel.is_Integer


def generate_combo(group: ComboGroup, graph: GraphIR, options: Any) -> TritonKernelSource:
    """One kernel running each part of a ComboGroup on its own range of programs:

        pid = tl.program_id(0)
        end0 = (n0 + XBLOCK - 1) // XBLOCK
        if pid < end0:
            pid_offset = pid
            <part 0's body>
        end1 = end0 + (n1 + XBLOCK - 1) // XBLOCK
        if (pid >= end0) & (pid < end1):
            ...

    Each part's values are local to its `if` (no `else`, so Triton merges nothing between
    branches and the same names may hold other types). The ends fold to constants: the
    sizes are static and XBLOCK a constexpr; the launcher's grid is the last end."""
    parts = []
    for p in group.parts:
        k = TritonKernel(p, graph, options)
        k.pid_name = "pid_offset"
        if k.emit_body() or k.kind != "pointwise" or k.symbols:
            raise AssertionError(f"{p.name} is no combo part ({k.kind})")  # combo_part admitted it
        parts.append(k)
    int64 = any(k.int64 for k in parts)
    lines = ["    pid = tl.program_id(0).to(tl.int64)" if int64 else "    pid = tl.program_id(0)"]
    writes: list[str] = []
    reads: list[str] = []
    for k in parts:
        writes += [b for b in k.writes if b not in writes]
    for k in parts:
        reads += [b for b in k.reads if b not in writes and b not in reads]
    describe, bodies = [], []
    for i, k in enumerate(parts):
        n = int(k.xnumel)
        start = f"end{i - 1}" if i else "0"
        lines.append(f"    end{i} = {start + ' + ' if i else ''}({n} + XBLOCK - 1) // XBLOCK")
        lines.append(f"    if pid < end{i}:" if not i else f"    if (pid >= {start}) & (pid < end{i}):")
        lines.append(f"        pid_offset = pid - {start}" if i else "        pid_offset = pid")
        bodies.append(k.body_lines())
        lines += ["    " + line for line in bodies[-1]]
        describe.append(" ".join(k._describe()))
        k.release()  # printed: the part lets go of its ops
    params = [f"in_{cname(b)}" for b in reads] + [f"out_{cname(b)}" for b in writes] + ["XBLOCK: tl.constexpr"]
    doc = f'    """combo of {len(parts)}: {" | ".join(describe)}"""'
    src = "@triton.jit\n" + f"def {group.name}({', '.join(params)}):\n" + doc + "\n" + "\n".join(lines) + "\n"
    buffers = reads + writes
    # an output over a dying input: only one no other part reads
    inplace = {}
    for k, body in zip(parts, bodies):
        others = {b for o in parts if o is not k for b in o.reads}
        for o, cands in inplace_candidates(k, body).items():
            alone = [c for c in cands if c not in others]
            if alone:
                inplace[o] = alone
    return TritonKernelSource(
        name=group.name, source=src, buffers=buffers, outputs=writes, symbols=[],
        bytes_accessed=sum(graph.nbytes(b) for b in buffers), language="python", kernel_kind="combo",
        xnumel=sympy.Integer(sum(int(k.xnumel) for k in parts)), elem_bytes=max(k.elem_bytes for k in parts),
        device="cpu" if parts[0].math.interpret else "cuda", buffer_dtypes=[graph.buffers[b].dtype for b in buffers],
        long_math=bool(_LONG_MATH.search(src)), inplace=inplace, parts=[int(k.xnumel) for k in parts])
