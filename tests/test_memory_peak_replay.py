"""`benchmarks.memory_peak` replays the CUDA allocator's history of one step: its peak
counts what the program asked for (requested bytes, as the history records them, not the
allocator's rounded blocks) and what was alive before the step, less what the step frees
of that (last step's gradients). Pure functions over recorded events: no GPU needed."""

from __future__ import annotations

from benchmarks.memory_peak import held_blocks, live_at_peak, size_difference


def _alloc(addr: int, size: int, line: str) -> dict:
    return {"action": "alloc", "addr": addr, "size": size, "frames": [{"filename": "<w>", "line": line, "name": "f"}]}


def test_the_peak_counts_what_was_held_before_the_step_less_what_the_step_freed_of_it() -> None:
    held = {1: (100, "(before the compile)"), 2: (40, "(before the compile)")}  # params, last step's grads
    trace = [{"action": "free_requested", "addr": 2, "size": 40}, _alloc(10, 30, "1"), _alloc(11, 20, "2"),
             {"action": "free_requested", "addr": 10, "size": 30}, _alloc(12, 25, "3")]
    p = live_at_peak(trace, held)
    assert p.bytes == 100 + 30 + 20  # the freed gradients no longer count; the later 25 comes after a free
    assert sorted(size for size, _ in p.alive) == [20, 30, 100]
    assert len(p.groups) == 2  # by line, the allocations made in the step only


def test_held_blocks_reads_requested_sizes_and_the_allocating_line() -> None:
    snap = {"segments": [{"device": 0, "blocks": [
        {"address": 5, "size": 1024, "requested_size": 1000, "state": "active_allocated",
         "frames": [{"filename": "<fuselens-wrapper-1>", "line": 3, "name": "call"}]},
        {"address": 6, "size": 512, "requested_size": 500, "state": "inactive"},
        {"address": 7, "size": 2048, "requested_size": 2000, "state": "active_allocated"}]}]}
    held = held_blocks(snap, 0)
    assert held[5][0] == 1000 and held[5][1].startswith("<fuselens-wrapper-1>:3")
    assert held[7] == (2000, "(before the compile)") and 6 not in held


def test_size_difference_names_the_extra_allocations() -> None:
    rows = size_difference([(8, "a"), (4, "b")], [(8, "x"), (8, "y"), (2, "z")])
    assert [(r["bytes"], r["extra"]) for r in rows] == [(8, 1), (4, -1), (2, 1)]
    assert rows[0]["lines"] == ["x", "y"]


def test_holder_chains_name_the_frames_that_keep_a_tensor_in_a_cycle() -> None:
    """What the H200 showed for BART: an exception kept in a frame of the code that raised
    it (a cycle through its traceback), whose frames hold their caller's locals."""
    import gc

    import torch

    from benchmarks.memory_peak import _holder_chains

    def step() -> None:
        logits = torch.ones(3)  # noqa: F841 - held by this frame, which the cycle keeps
        inner()

    def inner() -> None:
        try:
            raise ValueError("data-dependent branching")
        except ValueError as e:
            kept = e  # noqa: F841 - the frame holds its own exception, whose traceback holds the frame

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        step()
        gc.collect()
        garbage = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    tensors = [o for o in garbage if type(o) is torch.Tensor]
    assert len(tensors) == 1
    chains = _holder_chains(tensors[0], garbage)
    assert chains and all(c[0].startswith("frame step test_memory_peak_replay.py:") for c in chains), chains
    assert any(link.startswith("frame inner ") for c in chains for link in c), chains  # the callee that held it
    del garbage, tensors
