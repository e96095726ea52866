"""`benchmarks.collections_timed` (used by `benchmarks.compile_profile`) times Python's garbage collections by generation during the
profiled call: cProfile charges a collection to whatever function allocated when it began."""

from __future__ import annotations

import gc

from benchmarks.collections_timed import collections_timed


def test_the_collections_of_the_block_are_counted_and_timed_by_generation() -> None:
    with collections_timed() as seen:
        gc.collect(2)
        gc.collect(0)
    assert seen[2][0] == 1 and seen[2][1] >= 0.0
    assert seen[0][0] >= 1
    with collections_timed() as after:
        pass
    assert 2 not in after  # nothing is counted outside the block


def test_each_older_pass_is_listed_with_where_it_began() -> None:
    def allocating_function() -> None:
        gc.collect(1)

    older: list = []
    with collections_timed(older) as seen:
        allocating_function()
        gc.collect(0)
    assert seen[1][0] == 1
    assert [p.generation for p in older] == [1]  # the young pass is not listed
    assert older[0].where[0].endswith(":allocating_function")
    assert older[0].seconds >= 0.0 and older[0].frozen == gc.get_freeze_count()
