"""The scheduler's memory model, which its peak-memory rule judges fusions by: a
library call's output counted once, a view as nothing, and a backward's saved
activations live from its start to their last reader. ViT's backward joined its last
LayerNorm's column sums with the block before's: the model, counting its matmuls twice
and none of the saved activations, placed the graph's peak among the weight gradients
at its end, so a window at its start looked far below it; the join kept two float32
products alive across the MLP's gradients (ViT-B/16's backward, batch 32, planned on this
CPU for the GPU: 18 MB more at its peak). Graphs traced with make_fx, placeholders named
as AOTAutograd names a backward's."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fuselens.compiler import options
from fuselens.compiler.entry import _output_sources
from fuselens.compiler.lowering import lower
from fuselens.compiler.scheduler import Scheduler, schedule
from fuselens.compiler.step_memory import op_by_op_liveness, step_bytes

N, C = 1024, 1024  # a float32 [N, C] is 4 MiB
MiB = 1 << 20


def _lowered(fn, args, names):
    gm = make_fx(fn)(*args)
    for node, name in zip([n for n in gm.graph.nodes if n.op == "placeholder"], names):
        node.name = node.target = name
    gm.recompile()
    graph, outputs = lower(gm, options.current())
    return graph, _output_sources(graph, outputs)


def _layer_norms_tail(saved, saved_wide, w0, w, tangents_1):
    g = tangents_1 @ w0  # the last LayerNorm's output gradient
    s1 = (g * saved).sum(0)  # its weight gradient: a column sum
    big = (g @ w).relu()  # the MLP's gradient, 4C wide
    r = big @ w.t()
    s2 = (r * saved).sum(0)  # the block before's column sum: the same loops
    wg = saved_wide.t() @ r  # a weight gradient reading a wide saved activation
    return s1, s2, r, wg


def _tail_args():
    return (torch.randn(N, C), torch.randn(N, 8 * C), torch.randn(C, C), torch.randn(C, 4 * C), torch.randn(N, C))


def _kernel_of(sched, name):
    (group,) = [g for g in sched.groups if name in {n.name for n in g.nodes}]
    return group


def test_a_backwards_column_sums_are_not_joined_across_the_peak_its_saved_activations_make():
    graph, out_sources = _lowered(_layer_norms_tail, _tail_args(),
                                  ["saved", "saved_wide", "primals_1", "primals_2", "tangents_1"])
    sched = schedule(graph, options.current(), out_sources, "k")
    # joined, sum_1 would run after the MLP's gradient, g (4 MiB) alive across `big`
    assert _kernel_of(sched, "sum_1") is not _kernel_of(sched, "sum_2")


def test_a_backwards_saved_activations_count_from_its_start_to_their_last_reader():
    backward = ["saved", "saved_wide", "primals_1", "primals_2", "tangents_1"]
    graph, out_sources = _lowered(_layer_norms_tail, _tail_args(), backward)
    s = Scheduler(graph, options.current(), out_sources, "k")
    names = [step.name for step in s.steps]
    assert s.mem.released_readers == {"saved": [names.index("mul"), names.index("mul_1")],
                                  "saved_wide": [names.index("t_1"), names.index("mm_3")]}  # through its view
    # the same graph as a forward: its inputs are the caller's
    graph, out_sources = _lowered(_layer_norms_tail, _tail_args(), ["x", "y", "primals_1", "primals_2", "z"])
    f = Scheduler(graph, options.current(), out_sources, "k")
    assert f.mem.released_readers == {} and f._live_before[0] == 0
    extra = [(b - a) // MiB for a, b in zip(f._live_before, s._live_before)][:len(names)]
    # both (4 + 32 MiB) until mul_1 reads `saved` last, then the wide one until mm_3
    assert extra == [36] * (names.index("mul_1") + 1) + [32] * (len(names) - names.index("mul_1") - 1)


def test_a_library_calls_output_counts_once_and_a_view_counts_nothing():
    graph, _ = _lowered(_layer_norms_tail, _tail_args(), ["saved", "saved_wide", "primals_1", "primals_2", "tangents_1"])
    sizes = {step.name: step_bytes(graph, step) for step in graph.steps}
    assert sizes["mm"] == 4 * MiB and sizes["mm_1"] == 16 * MiB and sizes["mm_3"] == 32 * MiB
    assert sizes["t"] == sizes["t_1"] == 0


def test_op_by_op_liveness_frees_a_released_input_after_its_last_reader():
    # steps 0..2 each make 1 byte read by the next; a 10-byte input is last read by step 1
    before, peak = op_by_op_liveness([1, 1, 1], [[1], [2], []], {2}, [(10, 1)])
    assert before[:3] == [10, 11, 1] and peak == 12


def _first_ready_in_step_order(deps, lo, hi, unit_of, members):
    """The order the peak simulation places a window's units in, by its definition: again
    and again, the first unit in step order whose inputs have run; None on a cycle."""
    units = list(members)
    needs = {u: {unit_of.get(d, ("s", d)) for j in members[u] for d in deps[j] if lo <= d <= hi} - {u}
             for u in units}
    order, done, remaining = [], set(), list(units)
    while remaining:
        u = next((u for u in remaining if needs[u] <= done), None)
        if u is None:
            return None
        order.append(u)
        done.add(u)
        remaining.remove(u)
    return order


def test_the_peak_simulation_orders_a_windows_kernels_first_ready_in_step_order_and_finds_cycles():
    import random
    from types import SimpleNamespace

    rng = random.Random(0)
    cycles = 0
    for _ in range(300):
        n = rng.randint(2, 40)
        deps = [{j for j in range(i) if rng.random() < 0.15} for i in range(n)]
        lo, hi = rng.randint(0, n // 3), n - 1
        unit_of = {}
        for k in range(rng.randint(0, 4)):  # kernels of steps anywhere in the window: some make cycles
            for j in rng.sample(range(lo, hi + 1), rng.randint(1, min(5, hi - lo + 1))):
                unit_of.setdefault(j, ("k", k))
        members = {}
        for j in range(lo, hi + 1):
            members.setdefault(unit_of.get(j, ("s", j)), []).append(j)
        want = _first_ready_in_step_order(deps, lo, hi, unit_of, members)
        cycles += want is None
        assert Scheduler._unit_order(SimpleNamespace(deps=deps), lo, hi, unit_of, members) == want
    assert 0 < cycles < 300  # both outcomes were tried
