"""Lowering: an ATen/prims FX graph (after AOTAutograd) to the loop IR (ir.py).

    registry.py    the table of lowerings, `@register`, `NotLowered`
    lowerer.py     the walk over the FX graph: lowered ops, library calls, ATen fallbacks
    pointwise.py   pointwise ops; broadcasting and type promotion shared by the tables
    reductions.py  reductions (sum, mean, var, ...) and the library calls kept whole
    views.py       views and data movement as index maps (permute, view, cat, pad, ...)
    avg_pool.py    avg_pool2d, avg_pool3d and their backwards (window sums, ATen's divisors)
    max_pool.py    max_pool2d and max_pool3d with indices, and their backwards (window maxima)
    pool_windows.py   the pools' shared arguments, bounds and windows
    indexing.py    reads at indices held in a tensor (embedding, gather)
    foreach.py     `_foreach_*` ops (a CUDA optimizer's step), element by element
    rng.py         random tensors as Philox numbers in the kernels (compiler/random_ops.py)

`lower` imports the op tables, which register themselves into the table.
"""

from __future__ import annotations

from typing import Any

import torch.fx

from fuselens.compiler.ir import GraphIR
# the op tables register themselves into the table when imported
from fuselens.compiler.lowering import (  # noqa: F401
    avg_pool, foreach, indexing, max_pool, pointwise, reductions, rng, views)
from fuselens.compiler.lowering.lowerer import Lowerer


def lower(gm: torch.fx.GraphModule, options: Any) -> tuple[GraphIR, Any]:
    """Lower a graph; returns the IR and the FX output structure."""
    low = Lowerer(gm, options)
    g = low.lower()
    g.outputs = low.outputs  # type: ignore[attr-defined]
    return g, low.outputs
