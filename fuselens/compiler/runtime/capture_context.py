"""How one CUDA-graph capture runs (cuda_graphs.py): on the one side stream per device,
with Python's cycle collector held off and cuBLAS's workspaces dropped around it, and,
where CUDA refuses it, the process put back as it was (the user's stream, the device's
random generator)."""

from __future__ import annotations

import contextlib
import gc
import os
import re
from typing import Any, Iterator

import torch


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Python's cycle collector held off during a capture: a dropped graph that waits in a
    reference cycle (a family and its parked captures) would be destroyed in the middle of
    it, a CUDA call capture forbids (two forwards before their backwards on an H200: an
    illegal memory access two steps in, when the collector ran during the backward's capture)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def capturing(graph: Any, pool: Any, stream: Any) -> Iterator[None]:
    """`torch.cuda.graph`, and after a capture CUDA refused, the process left as it was.
    When the capture's end raises (a capture a step invalidated), torch.cuda.graph never
    leaves its stream, so the user's next kernels would run on our side stream; and the
    device's default generator never ran its capture epilogue, so on torch 2.11 its next
    draw outside a capture fails ("Offset increment outside graph capture encountered
    unexpectedly"): one refused capture would break every later torch.randn."""
    before = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            yield
    except BaseException:
        if torch.cuda.current_stream() != before:
            torch.cuda.set_stream(before)
        with contextlib.suppress(Exception):  # the capture's own error is the one to report
            _mend_default_generator(before.device_index)
        raise


def _mend_default_generator(device: int) -> None:
    """Give the device's default generator a fresh state (same seed and offset) if a refused
    capture left it expecting one. Only then: graphs captured before hold the old state and
    advance it at each replay, so a replaced state would draw numbers they also draw."""
    gen = torch.cuda.default_generators[device]
    try:
        torch.empty(1, device=f"cuda:{device}").uniform_(generator=gen)
    except RuntimeError:
        gen.graphsafe_set_state(gen.clone_state())


_warm_up_streams: dict[int, Any] = {}


def warm_up_stream(device: int) -> Any:
    """The one stream per device that warm-ups and captures run on. cuBLAS keeps a workspace
    per stream for the life of the process: a new stream per capture held 33 MB more each
    time (GPT-2 training: three graphs, 97 MB after the model was gone)."""
    stream = _warm_up_streams.get(device)
    if stream is None:
        stream = _warm_up_streams[device] = torch.cuda.Stream(device)
    return stream


@contextlib.contextmanager
def library_workspaces_in_pool() -> Iterator[None]:
    """cuBLAS's workspaces dropped before and after a warm-up or a capture, as Inductor's
    CUDA graph trees do. Before: a capture that used a workspace allocated outside its pool
    would write there on every replay, after whoever frees it (Inductor's recordings drop
    them all). After: the one it allocated in the pool, held by cuBLAS for good, was 32-65 MB
    of the graphs' pool among the activations (the suite's four models in training); freed,
    it is memory the graph uses while it runs, like its temporaries."""
    _clear_library_workspaces()
    try:
        yield
    finally:
        _clear_library_workspaces()


def cublas_workspace_bytes() -> int:
    """The bytes of the workspace cuBLAS allocates on a stream's first matmul (that stream's,
    once `library_workspaces_in_pool` dropped it): torch's own figure where it says (2.13),
    else its rule: CUBLAS_WORKSPACE_CONFIG's `:KiB:count` pairs, or 32 MiB on sm90 and
    4096 KiB * 2 + 16 KiB * 8 elsewhere (the 32 MB the H200's traces show)."""
    size = getattr(torch._C, "_cuda_getCublasWorkspaceSize", None)
    if size is not None:
        return int(size())
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "")
    pairs = re.findall(r":(\d+):(\d+)", config)
    if pairs:
        return sum(int(kib) * 1024 * int(n) for kib, n in pairs)
    major, minor = torch.cuda.get_device_capability()
    return 4096 * 8 * 1024 if (major, minor) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8


def _clear_library_workspaces() -> None:
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
