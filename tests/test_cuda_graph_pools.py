"""`benchmarks.cuda_graph_pools` splits what CUDA graphs hold by memory pool: each
private pool's reserved and allocated MB, the general pool apart. A pure function over
an allocator snapshot: no GPU needed."""

from __future__ import annotations

from benchmarks.cuda_graph_pools import pools

MB = 2 ** 20


def test_pools_sum_each_pools_segments_and_keep_the_general_pool_apart() -> None:
    snapshot = [
        {"segment_pool_id": (0, 0), "total_size": 20 * MB, "allocated_size": 2 * MB},
        {"segment_pool_id": (0, 3), "total_size": 64 * MB, "allocated_size": 60 * MB},
        {"segment_pool_id": (0, 3), "total_size": 2 * MB, "allocated_size": 0},
        {"segment_pool_id": (0, 4), "total_size": 8 * MB, "allocated_size": 8 * MB},
        {"total_size": 1 * MB, "allocated_size": 1 * MB},  # torch versions without the key: the general pool
    ]
    got = pools(snapshot)
    assert [(p["pool"], p["segments"], p["reserved_mb"], p["allocated_mb"]) for p in got] == [
        ("(0, 3)", 2, 66.0, 60.0), ("(0, 0)", 2, 21.0, 3.0), ("(0, 4)", 1, 8.0, 8.0)]
