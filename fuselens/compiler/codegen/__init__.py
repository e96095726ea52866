"""Code generators: turn a scheduled KernelGroup into source text.

The interface every generator implements (C++ in `cpp.py`, Triton in `triton.py`):

    generate(group: KernelGroup, graph: GraphIR, options) -> KernelSource
    library_source(kernels: list[KernelSource]) -> str      # one compilation unit per graph
    canonical_source(ks: KernelSource) -> str               # the kernel with name and buffers renamed
    alias_source(ks: KernelSource, same: KernelSource) -> str  # ks, defined as the identical `same`

The IR hands a generator everything through `group.nodes` (ComputeNodes with
bodies written against the `ops` handler contract in `ir.py`), `group.full` /
`group.rflags` (the iteration space), `group.level(node)` / `group.own_index`
(where each value lives) and `group.stores` (what must reach memory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import sympy


@dataclass
class KernelSource:
    """One generated kernel: its function text and its calling convention.
    Arguments are, in order: a pointer per name in `buffers` (inputs first, then
    `outputs`), then one int64 per symbol in `symbols`."""

    name: str
    source: str
    buffers: list[str]
    outputs: list[str]
    symbols: list[sympy.Symbol] = field(default_factory=list)
    bytes_accessed: int = 0
    language: str = "cpp"
    kind: str = "cpp"  # Kernel.kind of the report: "cpp" | "triton" (added for the Triton generator)
    device: str = "cpu"  # Kernel.device of the report (Triton sets "cuda" unless interpreted)
    inplace: dict = field(default_factory=dict)
    """output -> inputs the kernel reads only at the element it writes (same dtype and
    layout): the runtime may write the output into a dying input's storage (C++ only)."""



def reduction_phases(group: Any, members: dict) -> dict[str, int]:
    """The pass over the rows each member of a kernel group runs in (both targets): a
    pointwise member reading a finished reduction (or its outer epilogue) runs one pass
    later; an outer member runs in the pass of its latest input."""
    phase: dict[str, int] = {}
    for n in group.nodes:
        deps = [members[r] for r in n.reads if r in members]
        if group.level(n) == "outer":
            phase[n.name] = max([phase[d.name] for d in deps] or [-1])
        else:
            phase[n.name] = max([0] + [phase[d.name] + (1 if group.level(d) in ("reduction", "outer") else 0)
                                       for d in deps])
    return phase


def get_generator(target: str) -> Any:
    """The code generator module for `target` ("cpp"; "triton" when present)."""
    if target == "triton":
        from fuselens.compiler.codegen import triton  # type: ignore[attr-defined]

        return triton
    from fuselens.compiler.codegen import cpp

    return cpp


def resolve_target(target: str, example_inputs: Any) -> str:
    """Option `target` for these inputs: "auto" is "triton" when the inputs are
    CUDA tensors and "cpp" otherwise; "triton" on CPU tensors only runs under
    TRITON_INTERPRET=1 (tests), else it raises (the graph then runs eagerly)."""
    import os

    import torch

    on_cuda = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in example_inputs)
    if target == "auto":
        return "triton" if on_cuda else "cpp"
    if target == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("option target='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the "
                           "kernels in Triton's CPU interpreter)")
    if target == "cpp" and on_cuda:
        raise RuntimeError("option target='cpp' cannot run on CUDA tensors; use target='triton' or 'auto'")
    return target


def canonical_text(source: str, name: str, param_pattern: str) -> str:
    """A kernel's text with its name and its buffer parameters renamed by position.
    Two kernels with the same canonical text compute the same thing on different
    buffers (a model's repeated layers): the library defines the body once
    (`alias_source`), so it is compiled once, as Inductor does."""
    text = re.sub(rf"\b{re.escape(name)}\b", "K", source)
    names: dict[str, str] = {}
    return re.sub(param_pattern, lambda m: names.setdefault(m.group(0), f"p{len(names)}"), text)


def cname(name: str) -> str:
    """A buffer name as part of a C or Python identifier."""
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
