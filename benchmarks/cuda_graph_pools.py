"""What CUDA graphs hold, by memory pool, and what each fuselens CUDA graph holds: read by
`benchmarks.cuda_graph_memory` and by the suite's CUDA-graph rows (`benchmarks.models`).
No side effects at import (the suite imports it mid-run)."""

from __future__ import annotations

from typing import Optional

import torch

MB = 2 ** 20


def pools(segments: Optional[list[dict]] = None) -> list[dict]:
    """Each pool the allocator holds segments of (`torch.cuda.memory_snapshot()`'s, by
    default): MB reserved, MB allocated in it, largest first. The general pool is (0, 0)."""
    by: dict[str, dict] = {}
    for seg in torch.cuda.memory_snapshot() if segments is None else segments:
        pid = str(tuple(seg.get("segment_pool_id", (0, 0))))
        p = by.setdefault(pid, {"pool": pid, "segments": 0, "reserved_mb": 0.0, "allocated_mb": 0.0})
        p["segments"] += 1
        p["reserved_mb"] += seg["total_size"] / MB
        p["allocated_mb"] += seg["allocated_size"] / MB
    return sorted(by.values(), key=lambda p: -p["reserved_mb"])


def fuselens_graphs() -> list[dict]:
    """Each live fuselens CUDA graph runner: captures made (replaced ones included),
    captures again alone because a tensor its replay would overwrite was held (and why),
    signatures alive and the spare captures beside them (a forward called twice a step), their
    pools (a forward and its backward share one), their outputs' MB,
    and the inputs its replays copy into static buffers (MB held twice; the first 40 as
    position, shape, dtype)."""
    from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner

    out = []
    for r in list(CudaGraphRunner._live):
        outputs = copied = 0
        graph_pools = []
        for cap in r.captures():
            graph_pools.append(str(tuple(cap.graph.pool())))
            outputs += sum(b.nbytes for b in cap.outputs.buffers)
            copied += sum(a.untyped_storage().nbytes() for i, a in enumerate(cap.static)
                          if isinstance(a, torch.Tensor) and i not in cap.in_place)
        out.append({"graph": r.graph_id, "captures_made": r.captures_made, "signatures": len(r.graphs),
                    "spares": sum(len(c) for c in r.spares.values()),
                    "borrow": r.borrow, "failed": r.failed, "conflicts": r.conflicts, "last_conflict": r.last_conflict,
                    "pools": graph_pools,
                    "outputs_mb": outputs / MB, "copied_inputs_mb": copied / MB,
                    "copied_inputs": [list(c) for c in r.copied_inputs()[:40]]})
    return out


def gradients_in_graph_memory(module: torch.nn.Module) -> dict:
    """Where a training step left the parameters' gradients: on the memory of a fuselens CUDA
    graph's outputs (handed out, kept as `.grad` without a copy) or elsewhere (autograd
    cloned them: MB a step). Read right after a step, before the next zeroes them."""
    from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner

    ptrs = {p for r in list(CudaGraphRunner._live) for cap in r.captures() for p in cap.outputs.ptrs()}
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    copied = [g for g in grads if g.untyped_storage().data_ptr() not in ptrs]
    return {"gradients": len(grads), "in_graph_memory": len(grads) - len(copied),
            "copied_mb": sum(g.numel() * g.element_size() for g in copied) / MB}
