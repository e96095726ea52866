"""allocator_model.py: the caching allocator's rules for one pool, by which pool_reserve.py
decides a CUDA-graph pool's reservation (replayed against the GPU's recorded history by
benchmarks/cuda_graph_pool_model.py; its numbers are in benchmarks/RESULTS.md)."""

from __future__ import annotations

from fuselens.compiler.runtime.allocator_model import MB, PoolModel, replay


def test_a_large_request_no_freed_block_fits_makes_a_segment_of_its_own() -> None:
    events = [("alloc", 1, 12 * MB), ("alloc", 2, 30 * MB), ("free_requested", 1, 12 * MB), ("alloc", 3, 20 * MB)]
    pool = replay(events)
    assert pool.segments == [12 * MB, 30 * MB, 20 * MB]


def test_blocks_carved_from_one_reserved_segment_merge_again_when_freed() -> None:
    events = [("alloc", 1, 12 * MB), ("alloc", 2, 30 * MB), ("free_requested", 1, 12 * MB),
              ("free_requested", 2, 30 * MB), ("alloc", 3, 40 * MB)]
    assert replay(events).reserved_mb() == 82  # 12 + 30 + a new 40
    assert replay(events, reserve=42 * MB).segments == [42 * MB]  # 12 and 30 merged serve the 40


def test_small_requests_come_from_two_mib_segments_apart_and_mid_sized_ones_from_twenty() -> None:
    pool = PoolModel()
    a, b = pool.alloc(4096), pool.alloc(4 * MB)
    assert pool.segments == [2 * MB, 20 * MB]
    pool.free(a)
    pool.free(b)
    pool.alloc(15 * MB)  # the 20 MiB segment's block, free again, fits it
    assert pool.segments == [2 * MB, 20 * MB]
