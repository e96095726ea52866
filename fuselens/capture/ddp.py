"""Worker side: what Dynamo's DDP optimizer did (imports torch).

With `torch._dynamo.config.optimize_ddp` (on by default) Dynamo hands the
graph of a DistributedDataParallel module to `DDPOptimizer.compile_fn`, which
cuts it at DDP's gradient-bucket boundaries and compiles each piece with the
real backend. Users see several graphs for one forward and take them for
graph breaks. Wrapping `compile_fn` gives the buckets exactly as DDPOptimizer
chose them (`self.buckets`: size in bytes, parameter names, nodes), so the
report can say "bucket boundary, DistributedDataParallel(bucket_cap_mb=25)"
instead of guessing from the graphs.

`install(capture)` patches once per worker; `Capture.split_piece` tells
`CaptureBackend` to give each piece its own graph id while a split compiles.
"""

from __future__ import annotations

from typing import Any

from fuselens.capture import frames as fr
from fuselens.events import DDPBucket, DDPSplit, SourceLocation

_MB = 1024 * 1024
OPTION = (
    "DistributedDataParallel(bucket_cap_mb=...) sets the bucket size (a larger one gives fewer pieces); "
    "torch._dynamo.config.optimize_ddp = False compiles one graph, at the cost of overlapping "
    "gradient all-reduce with the backward"
)


def install(capture: Any) -> bool:
    """Wrap DDPOptimizer.compile_fn to emit a DDPSplit per split graph.
    False when this torch has no DDP optimizer (no torch.distributed)."""
    try:
        from torch._dynamo.backends import distributed as ddp_backend
    except ImportError:
        return False
    cls = getattr(ddp_backend, "DDPOptimizer", None)
    if cls is None or getattr(cls.compile_fn, "_fuselens_wrapped", False):
        return cls is not None
    original = cls.compile_fn

    def compile_fn(self: Any, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from fuselens.capture.hooks import _compile_id

        capture.split_piece = 0  # each piece compiled below gets its own graph id
        try:
            result = original(self, gm, example_inputs, **kwargs)
        finally:
            pieces, capture.split_piece = capture.split_piece, None
        buckets = list(getattr(self, "buckets", None) or [])
        if len(buckets) > 1:  # one bucket: DDPOptimizer compiled the graph whole
            try:
                capture.emit(_split_event(self, buckets, _compile_id(), capture))
            except Exception as exc:  # describing it must never break the compile
                capture.note_internal(f"could not describe a DDP graph split: {exc!r} ({pieces} pieces)")
        return result

    compile_fn._fuselens_wrapped = True  # type: ignore[attr-defined]
    cls.compile_fn = compile_fn
    return True


def _split_event(optimizer: Any, buckets: list[Any], cid: str, capture: Any) -> DDPSplit:
    frame = capture.frame_for(cid)
    if frame is not None:
        location = fr.make_location(*frame)
    else:
        location = SourceLocation("<unknown>", 0)
    return DDPSplit(
        compile_id=cid,
        function=location.function,
        location=location,
        bucket_cap_mb=round(optimizer.bucket_bytes_cap / _MB, 3),
        first_bucket_cap_mb=round(getattr(optimizer, "first_bucket_cap", 0) / _MB, 3),
        # DDPOptimizer walks the graph backwards and inserts each new bucket
        # in front: its list is already in forward (program) order.
        buckets=[DDPBucket(int(b.size), list(b.params), len(b.nodes)) for b in buckets],
        option=OPTION,
    )
