"""A model of the CUDA caching allocator's private pool: which segments a sequence of
allocations and frees makes it reserve.

The rules of c10's CUDACachingAllocator (torch 2.11-2.13, without `max_split_size` or
expandable segments) for one pool on one stream: requests up to 1 MiB take 2 MiB segments
of a small pool of their own; a larger request takes the smallest free block that fits,
split when more than 1 MiB is left, else a new segment of its size (20 MiB under 10 MiB,
else rounded up to 2 MiB); a freed block merges with the free neighbours of its segment.
Replaying the allocator's recorded history of CUDA-graph training steps through it gives
the segments and bytes the GPU reserved: ResNet-50's 76 segments and 1574 MB exactly, and
with a reservation the 2440, 2256 and 1366 MB measured for BERT, GPT-2 and ResNet-50
within 2 MB (benchmarks/cuda_graph_pool_model.py, thirty-first session). Pure Python,
no torch: pool_reserve.py runs it on a graph's plan before its first warm-up.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable, Optional

MB = 1 << 20
SMALL = 1 << 20  # requests up to this size: the small pool
SMALL_SEGMENT = 2 * MB
LARGE_SEGMENT = 20 * MB  # the segment of a request under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MB
ROUND_LARGE = 2 * MB


@dataclass(eq=False)
class Block:
    segment: int
    size: int
    small: bool
    free: bool = True
    prev: Optional["Block"] = None
    next: Optional["Block"] = None


@dataclass
class PoolModel:
    """One private pool of the caching allocator, on one stream."""

    segments: list[int] = field(default_factory=list)
    _free: dict[bool, list] = field(default_factory=lambda: {True: [], False: []})  # (size, seq, block)
    _seq: int = 0

    def _put(self, b: Block) -> None:
        self._seq += 1
        bisect.insort(self._free[b.small], (b.size, self._seq, b))

    def _take(self, b: Block) -> None:
        lst = self._free[b.small]
        lst.pop(next(i for i, e in enumerate(lst) if e[2] is b))

    def alloc(self, size: int) -> Block:
        small = size <= SMALL
        lst = self._free[small]
        i = bisect.bisect_left(lst, (size,))
        if i < len(lst):
            b = lst.pop(i)[2]
        else:
            seg = SMALL_SEGMENT if small else LARGE_SEGMENT if size < MIN_LARGE_ALLOC else -(-size // ROUND_LARGE) * ROUND_LARGE
            b = Block(len(self.segments), seg, small)
            self.segments.append(seg)
        rest = b.size - size
        if (small and rest >= 512) or (not small and rest > SMALL):
            r = Block(b.segment, rest, small, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = r
            b.next, b.size = r, size
            self._put(r)
        b.free = False
        return b

    def free(self, b: Block) -> None:
        b.free = True
        for n in (b.prev, b.next):
            if n is None or not n.free:
                continue
            self._take(n)
            first, second = (n, b) if n is b.prev else (b, n)
            first.size += second.size
            first.next = second.next
            if second.next is not None:
                second.next.prev = first
            b = first
        self._put(b)

    def reserved_mb(self) -> float:
        return sum(self.segments) / MB


def round_size(nbytes: int) -> int:
    """The block size the allocator gives a request of `nbytes`."""
    return 512 if nbytes < 512 else -(-nbytes // 512) * 512


def replay(events: Iterable[tuple[str, object, int]], reserve: int = 0) -> PoolModel:
    """The pool after `events` ((action, key, bytes) in order: "alloc" a block under `key`,
    "free_requested" the block under `key`), with one segment of `reserve` bytes reserved
    and freed first."""
    pool = PoolModel()
    if reserve:
        pool.free(pool.alloc(reserve))
    live: dict[object, Block] = {}
    for action, addr, size in events:
        if action == "alloc":
            live[addr] = pool.alloc(size)
        elif addr in live:
            pool.free(live.pop(addr))
    return pool
