"""What a CUDA-graph capture does with its inputs' memory (cuda_graphs.py): which inputs
keep their address (AOTAutograd's static inputs), the static copies an expanded input
needs, the aliases it keeps of inputs read in place, and the copies before each replay."""

from __future__ import annotations

import bisect

import torch


def on_copies(t: torch.Tensor, pool: set[int], copies: list[tuple[int, int]]) -> bool:
    """Whether `t` lies on the family's memory (`pool`: its blocks' addresses) where it
    overlaps one of the input copies' `copies` ((start, end), sorted)."""
    st = t.untyped_storage()
    start = st.data_ptr()
    return start in pool and overlaps(start, start + st.nbytes(), copies)


def overlaps(start: int, end: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether bytes [start, end) share one with the sorted, disjoint `ranges`."""
    k = bisect.bisect_right(ranges, (start, float("inf")))
    return (k > 0 and ranges[k - 1][1] > start) or (k < len(ranges) and ranges[k][0] < end)


def overlapping(t: torch.Tensor) -> bool:
    """Whether elements of `t` share memory: a dim of stride 0 (an `expand`) holding more than one."""
    return any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride()))


def span(t: torch.Tensor) -> torch.Tensor:
    """The 1-D run of `t`'s storage from its first element to its last (strides are never negative)."""
    n = 0 if t.numel() == 0 else 1 + sum((k - 1) * st for k, st in zip(t.shape, t.stride()))
    return t.as_strided((n,), (1,), t.storage_offset())


def alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor at `t`'s address that owns nothing (and does not count as holding it): what a
    capture keeps of an input it reads in place from another graph, to compare addresses."""
    st = t.untyped_storage()
    mem = torch._C._construct_storage_from_data_pointer(st.data_ptr(), t.device, st.nbytes())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(mem, t.storage_offset(), t.shape, t.stride())


def copy_all(dsts: list, srcs: list) -> None:
    """`dst.copy_(src)` for each pair, as few launches as torch's multi-tensor copy makes
    (Inductor's CUDA graphs copy their inputs so): a compiled optimizer step copies every
    gradient (Dynamo marks parameters and state static, not gradients), 76 launches a
    step for GPT-2's, 161 for ResNet-50's."""
    if len(dsts) > 1:
        torch._foreach_copy_(dsts, srcs)
    elif dsts:
        dsts[0].copy_(srcs[0])


def _forward_static_indices() -> set[int]:
    try:
        from torch._guards import TracingContext

        ctx = TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
        return set(getattr(meta, "static_input_indices", None) or ())
    except (ImportError, AttributeError):  # pragma: no cover - other torch versions
        return set()


def gradient_output_indices() -> set[int]:
    """For a backward being compiled: its outputs that are gradients of parameters or
    buffers. AOTAutograd's backward returns one gradient per forward input, and the
    tracing context still holds the forward's metadata, whose static inputs are those."""
    return _forward_static_indices()


def static_input_indices(backward: bool = False) -> set[int]:
    """Inputs of the graph being compiled that AOTAutograd knows keep their address
    from call to call: parameters and buffers (a BatchNorm's running statistics are
    buffers, not Parameters). Empty outside a compile, and for a backward: while it
    compiles, the tracing context still holds its forward's metadata, whose indices are
    the forward's inputs. Taken for the backward's, they made ResNet-50's output
    gradient (a new tensor every step) "static": a capture on every step, 0.13x of
    reduce-overhead. A backward's saved activations are read in place by borrowing."""
    return set() if backward else _forward_static_indices()
