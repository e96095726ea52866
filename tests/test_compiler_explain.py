"""Fusion decisions, events, options, the build cache and the compile-error
fallback of the fuselens compiler."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import fuselens.compiler as fc
from fuselens import sink
from fuselens.compiler.runtime import cpp_build as build_mod
from fuselens.compiler.options import UnknownOptionError
from fuselens.events import CompiledGraph, ErrorEntry, FusionDecision, Kernel, KernelTiming, PhaseTime


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    fc.reset()
    yield
    torch._dynamo.reset()
    fc.reset()


def compile_events(fn, *args, **kw):
    with sink.collect() as events:
        out = torch.compile(fn, backend="fuselens", **kw)(*args)
    torch.testing.assert_close(out, fn(*args))
    return events


def of(events, cls):
    return [e for e in events if isinstance(e, cls)]


def test_layernorm_fusion_decision_names_one_kernel_and_the_row_pass():
    events = compile_events(lambda x, w, b: F.layer_norm(x, (64,), w, b), torch.randn(16, 64), torch.randn(64),
                            torch.randn(64))
    (k,) = [k for k in of(events, Kernel) if k.kind == "cpp"]
    fused = [d for d in of(events, FusionDecision) if d.decision == "fused"]
    assert len(fused) == 1 and fused[0].kernel == k.name
    assert "same rows" in fused[0].reason and "epilogue" in fused[0].reason
    (graph,) = of(events, CompiledGraph)
    assert graph.graph_id == fused[0].graph_id == k.graph_id
    assert {n.kernel for n in graph.nodes if n.op == "call_function" and n.kernel} == {k.name}


def test_transposed_read_is_not_fused_and_says_why():
    events = compile_events(lambda x: x.sin().t().contiguous() * 2, torch.randn(8, 8))
    refused = [d for d in of(events, FusionDecision) if d.decision == "not_fused"]
    assert refused, "expected a not_fused decision"
    assert refused[0].rule == "same-index" and "sin" in refused[0].nodes[0]
    assert "other positions" in refused[0].reason


def test_reduction_of_a_reduction_reports_different_iteration_space():
    events = compile_events(lambda x: x.amax(-1).sum(), torch.randn(32, 16))
    refused = [d for d in of(events, FusionDecision) if d.decision == "not_fused"]
    assert any(d.rule == "iteration-space" and "different iteration space" in d.reason for d in refused)


def test_not_fused_because_of_option_names_the_option():
    events = compile_events(lambda x: torch.softmax(x, -1), torch.randn(8, 32), options={"epilogue_fusion": False})
    refused = [d for d in of(events, FusionDecision) if d.decision == "not_fused"]
    assert any(d.option == "epilogue_fusion" for d in refused)
    assert len([k for k in of(events, Kernel) if k.kind == "cpp"]) > 1


def test_matmul_edges_are_explained_as_library_calls():
    events = compile_events(lambda x, w: torch.relu(x @ w), torch.randn(8, 16), torch.randn(16, 4))
    assert any(d.rule == "extern" for d in of(events, FusionDecision))


def test_max_fusion_size_splits_long_chains():
    def f(x):
        for _ in range(6):
            x = x.sin() + 1
        return x

    events = compile_events(f, torch.randn(100), options={"max_fusion_size": 4})
    assert len([k for k in of(events, Kernel) if k.kind == "cpp"]) >= 3
    assert any(d.option == "max_fusion_size" for d in of(events, FusionDecision))


def test_ops_recomputed_inside_a_kernel_do_not_count_against_max_fusion_size():
    # T5's relative position bias: index arithmetic and a table lookup recomputed in the
    # softmax that adds it; counted as ops, the softmax split into two kernels on the GPU
    def biased_softmax(scores, table):
        s = scores.shape[-1]
        rel = torch.arange(s)[None, :] - torch.arange(s)[:, None]
        bucket = (rel > 0).long() * 8 + torch.clamp(rel.abs(), max=7)
        bias = table[bucket].permute(2, 0, 1)
        return torch.softmax(scores + bias, dim=-1)

    scores, table = torch.randn(2, 4, 32, 32), torch.randn(16, 4)
    events = compile_events(biased_softmax, scores, table, options={"max_fusion_size": 8})
    (kernel,) = [k for k in of(events, Kernel) if k.kind == "cpp"]
    assert "amax" in kernel.name and "arange" in kernel.name


def test_options_changed_between_compiles_take_effect():
    f = lambda x: x.sin() * 2 + 1  # noqa: E731
    x = torch.randn(64)
    fc.configure(fusion=False)
    n_unfused = len([k for k in of(compile_events(f, x), Kernel) if k.kind == "cpp"])
    torch._dynamo.reset()
    fc.configure(fusion=True)
    n_fused = len([k for k in of(compile_events(f, x), Kernel) if k.kind == "cpp"])
    assert n_unfused == 3 and n_fused == 1


def test_unknown_option_is_a_clear_error():
    with pytest.raises(UnknownOptionError, match="valid options: fusion"):
        fc.resolve({"fusoin": True})
    with pytest.raises(Exception, match="unknown fuselens compiler option"):
        torch.compile(lambda x: x + 1, backend="fuselens", options={"fusoin": True})(torch.ones(2))


def test_compile_error_falls_back_to_eager_and_names_the_kernel():
    def break_kernel(name, source):
        return source.replace("{", "{ this is not C++;", 1)

    events = compile_events(lambda x: x.exp() + 1, torch.randn(10), options={"source_hook": break_kernel})
    (err,) = [e for e in of(events, ErrorEntry) if e.kind == "compile"]
    assert "cpp_fused_add_exp_0" in err.message and "runs eagerly" in err.message


def test_a_rewrite_failing_half_way_falls_back_to_the_graph_as_traced(monkeypatch):
    """A graph rewrite of ours that changed the graph and then failed (a fuselens bug) must
    not leave its half-made graph to the eager fallback: it runs the graph as traced."""
    from fuselens.compiler import graph_passes

    def half_made(gm):
        for n in gm.graph.nodes:
            if n.target is torch.ops.aten.add.Tensor:
                n.target = torch.ops.aten.sub.Tensor
        gm.recompile()
        raise RuntimeError("a rewrite bug")

    monkeypatch.setattr(graph_passes, "gather_through_pointwise", half_made)
    x = torch.randn(10)
    torch._dynamo.reset()
    with sink.collect() as events:
        out = torch.compile(lambda x: x.exp() + 1, backend="fuselens")(x)
    torch.testing.assert_close(out, x.exp() + 1)
    (err,) = [e for e in of(events, ErrorEntry) if e.kind == "internal"]
    assert "a rewrite bug" in err.message and "runs eagerly" in err.message


def test_second_compile_hits_the_disk_cache(tmp_path, monkeypatch):
    calls = []
    real_run = build_mod.subprocess.run
    monkeypatch.setattr(build_mod.subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    opts = {"cache_dir": str(tmp_path)}
    compile_events(lambda x: x.cos() * 3, torch.randn(20), options=opts)
    assert len(calls) == 1
    libs = list(tmp_path.rglob("*.so"))
    assert len(libs) == 1
    torch._dynamo.reset()
    build_mod._loaded.clear()  # forget the in-process copy: only the disk cache remains
    compile_events(lambda x: x.cos() * 3, torch.randn(20), options=opts)
    assert len(calls) == 1


def test_events_cover_phases_and_kernel_sources():
    events = compile_events(lambda x: torch.softmax(x, -1) * 2, torch.randn(4, 8))
    phases = {p.phase for p in of(events, PhaseTime)}
    assert {"aot", "lowering", "scheduling", "codegen", "cpp_compile"} <= phases
    (k,) = [k for k in of(events, Kernel) if k.kind == "cpp"]
    assert k.language == "cpp" and 'extern "C" void ' + k.name in k.source and k.bytes_accessed == 2 * 4 * 8 * 4
    assert k.source_lines and k.source_lines[0].file.endswith("test_compiler_explain.py")


def test_kernel_timing_is_batched_through_a_flusher():
    cf = torch.compile(lambda x: x.exp() * 2, backend="fuselens", options={"time_kernels": True})
    x = torch.randn(100)
    with sink.collect() as events:
        for _ in range(5):
            cf(x)
        sink.flush()
        sink.flush()  # nothing new: no second event
    timings = of(events, KernelTiming)
    assert len(timings) == 1 and timings[0].calls == 5 and timings[0].total_time_us > 0


def test_fusing_a_late_consumer_that_would_raise_peak_memory_is_refused():
    def f(x, y):
        a = x.sin()
        m = (y @ y).relu()  # large buffers live between sin and cos
        t = (m @ m).sum()
        c = a.cos()  # fused into sin's kernel, c would be live across both matmuls
        return c + t, a

    events = compile_events(f, torch.randn(512, 512), torch.randn(1024, 1024))
    apart = [d for d in of(events, FusionDecision) if d.decision == "not_fused" and d.nodes == ["sin", "cos"]]
    assert apart and apart[0].rule == "peak-memory", apart
    assert "raise peak memory from" in apart[0].reason and "MB" in apart[0].reason


def test_fusing_an_adjacent_consumer_is_not_blocked_by_the_peak_memory_rule():
    events = compile_events(lambda x: x.sin().cos() + 1, torch.randn(512, 512))
    assert not [d for d in of(events, FusionDecision) if d.rule == "peak-memory"]
    assert len(of(events, Kernel)) == 1


@pytest.fixture
def schedules(monkeypatch):
    """The Schedule of every graph compiled in the test, as the scheduler returned it
    (entry.py imports `schedule` at each compile, so wrapping it sees every call)."""
    from fuselens.compiler import scheduler

    made = []
    real = scheduler.schedule

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(scheduler, "schedule", recording)
    return made


def test_not_fused_events_carry_the_decision_the_scheduler_recorded_when_it_tried_the_pair(schedules):
    def f(x):
        y = x.sin().t().contiguous() * 2  # same-index
        z = y.amax(-1).sum()  # a reduction of a reduction: iteration-space
        for _ in range(3):
            y = y.cos() + 1  # a chain longer than max_fusion_size
        return y, z

    events = compile_events(f, torch.randn(8, 8), options={"max_fusion_size": 3})
    sched = schedules[-1]  # scheduled again after producers were recomputed in their readers
    assert {d.verdict for d in sched.decisions} == {"fused", "not_fused"}
    fx_of = {n.name: n.fx_nodes[0] for g in sched.groups for n in g.nodes}
    standing: dict = {}
    for (producer, consumer), d in sched.last_decisions().items():
        standing.setdefault((fx_of[producer], fx_of[consumer]), set()).add((d.verdict, d.rule, d.reason, d.option))
    refused = [d for d in of(events, FusionDecision) if d.decision == "not_fused"]
    assert {d.rule for d in refused} >= {"same-index", "iteration-space", "max-fusion-size"}
    for d in refused:
        assert ("not_fused", d.rule, d.reason, d.option) in standing[tuple(d.nodes)], d


def test_refusal_by_a_kernel_later_merged_away_keeps_the_rule_that_decided():
    def f(x, y):
        a = (x.sin() * x.cos() + 1).exp().tanh()  # kernel A
        c = a[:, 0] * 2  # 8 vs A's 8x8: refused by A for its iteration space
        s = y.sum(-1, keepdim=True)
        t = a + s  # joins s's row kernel, which then pulls A in: A is merged away (and freed)
        return c, t, a

    events = compile_events(f, torch.randn(8, 8), torch.randn(8, 8))
    (row_kernel,) = [k for k in of(events, Kernel) if "sum_1" in k.nodes]
    (refused,) = [d for d in of(events, FusionDecision) if d.decision == "not_fused"]
    assert refused.nodes[0] in row_kernel.nodes  # the producer ended up in another kernel than the one tried
    # re-checking against the final row kernel would blame a same-index read (its outer
    # loop does have c's 8 elements); the decision was made on A, for its iteration space
    assert refused.rule == "iteration-space" and "8 vs 8x8" in refused.reason, refused


def test_a_late_window_may_grow_below_the_graphs_peak():
    # the peak is `big`, early; the sin/cos fusion grows the later window, not the graph's peak
    def f(x, y):
        big = (y @ y).exp()
        s = big.sum()
        a = x.sin()
        m = (x @ x).relu()
        t = (m @ m).sum()
        c = a.cos()
        return c + t + s, a

    events = compile_events(f, torch.randn(256, 256), torch.randn(2048, 2048))
    assert not [d for d in of(events, FusionDecision) if d.rule == "peak-memory"]
    fused = [d for d in of(events, FusionDecision) if d.decision == "fused" and {"sin", "cos"} <= set(d.nodes)]
    assert fused, [(d.nodes, d.rule) for d in of(events, FusionDecision)]


def test_the_peak_simulation_places_each_kernel_as_early_as_its_inputs_allow_and_sees_cycles():
    """The window's units run in step order, each as soon as all it reads is placed: a
    kernel of steps 1 and 4 runs after steps 2 and 3, which step 4 reads through."""
    from types import SimpleNamespace

    from fuselens.compiler.scheduler import Scheduler

    # step -> the steps it reads
    fake = SimpleNamespace(deps=[set(), {0}, {0}, {2}, {3}, {4}])
    unit_of = {1: ("k", 0), 4: ("k", 0)}
    members = {("s", 0): [0], ("k", 0): [1, 4], ("s", 2): [2], ("s", 3): [3], ("s", 5): [5]}
    assert Scheduler._unit_order(fake, 0, 5, unit_of, members) == [("s", 0), ("s", 2), ("s", 3), ("k", 0), ("s", 5)]
    # a kernel of steps 2 and 4 around step 3, which reads 2 and feeds 4: a cycle
    fake = SimpleNamespace(deps=[set(), {0}, {1}, {2}, {3}])
    members = {("s", 0): [0], ("s", 1): [1], ("k", 0): [2, 4], ("s", 3): [3]}
    assert Scheduler._unit_order(fake, 0, 4, {2: ("k", 0), 4: ("k", 0)}, members) is None


def test_a_fusion_refused_as_a_cycle_names_the_step_that_closes_it():
    # x * 2 feeds the matmul and, with the matmul's result, the sum: the sum in the
    # product's kernel would need the matmul before that kernel and after it
    def f(x, w):
        a = (x * 2).sin()
        return torch.tanh(a) + a @ w

    events = compile_events(f, torch.randn(16, 16), torch.randn(16, 16), options={"epilogue_fusion": False})
    cycles = [d for d in of(events, FusionDecision) if d.rule == "cycle"]
    assert cycles and all("through mm" in d.reason for d in cycles), [d.reason for d in of(events, FusionDecision)]
