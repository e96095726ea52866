"""Inductor in capture: kernel timing per graph, fusion decisions from
Inductor's own fusion log, nested compile phases, config overrides.

The fast tests feed the worker-side readers what Inductor writes (output code
and provenance as the structured trace carries them, `WhyNoFuse` objects on
the real fusion logger) and profile with the real torch profiler; the slow
ones compile with Inductor for real (~1 min each on 2 shared cores)."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest

from fuselens import kernel_timing, sink
from fuselens.capture import RunOptions, Target, WorkerSession, assemble
from fuselens.capture.assemble import nest_phase
from fuselens.events import FusionDecision, KernelTiming, PhaseTime, RunInfo

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")


class _Capture:
    """The one method InductorKernels calls on the graph capture."""

    def mark_kernels(self, compile_id: str, node_kernel: dict) -> None:
        pass


def _output_code(graph_no: int) -> str:
    """An Inductor output module as `inductor_output_code` carries it, with
    `cpp.enable_kernel_profile` and `profiler_mark_wrapper_call` on."""
    return (
        "cpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], r'''\n"
        '#include <torch/csrc/inductor/cpp_prefix.h>\n'
        'extern "C" void kernel(float* out_ptr0)\n{\n'
        f"    torch::aot_inductor::RAIIAtenRecordFunctionHandle record_graph_{graph_no}_cpp_fused_add_0_"
        f'("graph_{graph_no}_cpp_fused_add_0", nullptr);\n'
        "}\n''')\n\n"
        "def call(args):\n"
        f"    with record_function('graph_{graph_no}_inductor_wrapper_call'):\n"
        "        extern_kernels.addmm(arg0_1, arg1_1, arg2_1, out=buf0)\n"
        "        cpp_fused_add_0(buf0)\n"
    )


def _feed_graph(kernels, cid: str, graph_no: int) -> None:
    kernels.on_record(cid, {"inductor_output_code": {"filename": "x.py"}}, _output_code(graph_no))
    mappings = {
        "cppCodeToPost": {"cpp_fused_add_0:1": ["add"], "extern_kernels.addmm:2": ["addmm"]},
        "postToPre": {"add": ["add"], "addmm": ["linear"]},
    }
    kernels.on_record(cid, {"artifact": {"name": "inductor_provenance_tracking_node_mappings"}}, json.dumps(mappings))
    kernels.on_compile_end(cid)


def test_kernel_times_of_a_recompiled_graph_land_on_its_own_kernels():
    import torch
    from torch.profiler import record_function

    from fuselens.capture.inductor import InductorKernels

    events = []
    kernels = InductorKernels(events.append, _Capture())
    kernels.reset_run(time_kernels=True)
    _feed_graph(kernels, "0/0", 0)
    _feed_graph(kernels, "0/1", 1)  # the recompile: same kernel names, Inductor graph 1
    a, b = torch.randn(4, 4), torch.randn(4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for graph_no, calls in ((0, 2), (1, 3)):
            for _ in range(calls):  # what the generated wrapper does per call
                with record_function(f"graph_{graph_no}_inductor_wrapper_call"):
                    torch.addmm(b, a, a)
                    with record_function(f"graph_{graph_no}_cpp_fused_add_0"):
                        a + 1
    kernel_timing.clear()  # what the worker does after each run: only this run's timers are collected
    with sink.collect() as collected:
        kernels._attribute(prof)
        sink.flush()  # the run's collect (fuselens/kernel_timing.py)
    events += collected
    timed = {(t.graph_id, t.name): t.calls for t in events if isinstance(t, KernelTiming)}
    assert timed == {
        ("0/0:dynamo", "cpp_fused_add_0"): 2,
        ("0/0:dynamo", "extern_kernels.addmm"): 2,
        ("0/1:dynamo", "cpp_fused_add_0"): 3,
        ("0/1:dynamo", "extern_kernels.addmm"): 3,
    }
    report = assemble(events)
    calls = {(k.graph_id, k.name): k.calls for k in report.kernels}
    assert calls[("0/1:dynamo", "cpp_fused_add_0")] == 3 and calls[("0/0:dynamo", "cpp_fused_add_0")] == 2


def test_inductor_compile_and_autotune_work_is_not_counted_as_calls():
    """Inductor's benchmark launches run inside a `(dynamo_timed)` range; real CPU profiler."""
    import torch
    from torch.profiler import record_function

    from fuselens.capture.inductor import InductorKernels

    kernel_timing.clear()  # only this test's timers are collected
    kernels = InductorKernels(lambda event: None, _Capture())
    kernels.reset_run(time_kernels=True)
    _feed_graph(kernels, "0/0", 0)
    a = torch.randn(4, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with record_function("graph_0_inductor_wrapper_call"):
                with record_function("CachingAutotuner.benchmark_all_configs (dynamo_timed)"):
                    with record_function("graph_0_cpp_fused_add_0"):
                        a + 1
                with record_function("graph_0_cpp_fused_add_0"):
                    a + 1
    kernels._attribute(prof)
    assert {(t.name, t.calls) for t in _collected_timings()} == {("cpp_fused_add_0", 2)}


class _Event:
    """FAKE profiler event (no GPU here): the fields of torch's FunctionEvent that matter."""

    def __init__(self, name, id=0, parent=None, linked=0, device_us=0.0):
        self.name, self.id, self.cpu_parent, self.linked_correlation_id = name, id, parent, linked
        self.device_time_total, self.cpu_time_total = device_us, 0.0


class _Profile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_device_events_launched_by_inductors_autotuner_are_not_counted():
    """FAKE device events (no GPU here): a kernel's benchmark launches are found through
    the host call that launched them (its correlation id)."""
    from fuselens.capture.inductor import InductorKernels
    from fuselens.events import Kernel

    kernel_timing.clear()  # only this test's timers are collected
    kernels = InductorKernels(lambda event: None, None)
    kernels.reset_run(time_kernels=True)
    kernels._kernels[("0/0:dynamo", "triton_poi_fused_add_0")] = Kernel("triton_poi_fused_add_0", "triton",
                                                                       graph_id="0/0:dynamo")
    tuning = _Event("CachingAutotuner.benchmark_all_configs (dynamo_timed)")
    tuned_launch = _Event("cuLaunchKernel", id=7, parent=tuning)
    call_launch = _Event("cuLaunchKernel", id=8, parent=_Event("graph_0_inductor_wrapper_call"))
    device = [_Event("triton_poi_fused_add_0", linked=7, device_us=9.0),
              _Event("triton_poi_fused_add_0", linked=8, device_us=2.0)]
    kernels._attribute(_Profile([tuning, tuned_launch, call_launch, *device]))
    (timing,) = _collected_timings()
    assert (timing.name, timing.calls, timing.total_time_us) == ("triton_poi_fused_add_0", 1, 2.0)


def _collected_timings() -> list[KernelTiming]:
    """What the run's collect of its kernel timers emits (fuselens/kernel_timing.py)."""
    with sink.collect() as events:
        sink.flush()
    return [e for e in events if isinstance(e, KernelTiming)]


def test_timings_of_the_fuselens_backend_match_kernels_of_each_graph():
    """The fuselens runtime streams KernelTiming with the graph id of the
    Kernel it emitted; a recompiled graph's kernels keep their own counts,
    also when a timing arrives before its kernel."""
    from fuselens.events import Kernel

    stream = [
        Kernel("cpp_fused_mul_0", "cpp", graph_id="0/0:aot_inference"),
        KernelTiming("cpp_fused_mul_0", "0/1:aot_inference", 3, 30.0),  # before its kernel
        Kernel("cpp_fused_mul_0", "cpp", graph_id="0/1:aot_inference"),
        KernelTiming("cpp_fused_mul_0", "0/0:aot_inference", 2, 10.0),
        KernelTiming("cpp_fused_mul_0", "0/1:aot_inference", 1, 5.0),
    ]
    report = assemble(stream)
    got = {k.graph_id: (k.calls, k.total_time_us) for k in report.kernels}
    assert got == {"0/0:aot_inference": (2, 10.0), "0/1:aot_inference": (4, 35.0)}


class _FxNode:
    def __init__(self, name: str, line: int) -> None:
        self.name = name
        self.meta = {"stack_trace": f'  File "{CORPUS}/ind_fusion.py", line {line}, in center_relu\n    x\n'}


class _Op:
    def __init__(self, *origins: _FxNode) -> None:
        self._origins = list(origins)

    def get_origins(self):
        return self._origins


class _SchedNode:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


class _Graph:
    """What the fusion log reads of GraphLowering while the scheduler runs."""

    name_to_buffer: dict = {}

    def __init__(self) -> None:
        self.name_to_op = {
            "op0": _Op(_FxNode("mean", 5)),
            "op1": _Op(_FxNode("mean", 5), _FxNode("sub", 5), _FxNode("relu", 6)),  # mean's tail inlined
            "op2": _Op(_FxNode("mul", 6)),
        }


@pytest.fixture
def fusion_log():
    from torch._inductor.virtualized import V

    from fuselens.capture import inductor_fusion

    handler = inductor_fusion.install()
    handler.reset_run()
    try:
        with V.set_graph_handler(_Graph()):
            yield handler
    finally:
        logging.getLogger(inductor_fusion.FUSION_LOGGER).removeHandler(handler)


def test_inductor_refusals_become_not_fused_decisions_in_user_words(fusion_log):
    from torch._inductor.scheduler import WhyNoFuse

    from fuselens.capture.inductor import _Segment
    from fuselens.capture.inductor_fusion import FUSION_LOGGER, fusion_decisions

    WhyNoFuse(_SchedNode("op0"), _SchedNode("op1"))("exceeds max fusion")  # Inductor's own message object
    WhyNoFuse(_SchedNode("op0"), _SchedNode("op1"))("exceeds max fusion")  # a second round tries again
    WhyNoFuse(_SchedNode("op1"), _SchedNode("op2"))("no shared data")
    logging.getLogger(FUSION_LOGGER).debug("fusing %s with %s", "op1", "op2")  # ...then fused after all
    refusals = fusion_log.take("")
    assert [r.names for r in refusals] == [("op0", "op1"), ("op0", "op1")]
    seg = _Segment(
        post_targets={"mean": "aten.mean.dim", "sub": "aten.sub.Tensor", "relu": "aten.relu.default", "mul": "aten.mul.Tensor"},
        code_to_post={"cpp_fused_mean_0:1": ["mean"], "cpp_fused_mul_relu_sub_1:2": ["sub", "relu", "mul"]},
        post_to_pre={"mean": ["mean"], "sub": ["centered"], "relu": ["relu"], "mul": ["mul"]},
        refusals=refusals,
    )
    (decision,) = fusion_decisions(seg, [], "0/0:dynamo")
    assert decision == FusionDecision(
        decision="not_fused",
        nodes=["mean", "centered"],
        reason=decision.reason,
        graph_id="0/0:dynamo",
        rule="inductor:max_fusion_size",
        locations=decision.locations,
        option="torch._inductor.config.max_fusion_size",
    )
    assert "more ops into one kernel than Inductor allows" in decision.reason
    assert "cpp_fused_mean_0" in decision.reason and "cpp_fused_mul_relu_sub_1" in decision.reason
    assert [(loc.line, loc.function) for loc in decision.locations] == [(5, "center_relu"), (6, "center_relu")]


def test_inductor_phases_name_their_parent_and_are_not_summed_twice():
    from fuselens.capture.tracehandler import TraceHandler
    from fuselens.report.charts import phase_rows
    from fuselens.report.terminal import render_terminal

    events = []
    handler = TraceHandler(events.append)
    handler._on_metrics(
        {
            "compile_id": "0/0",
            "entire_frame_compile_time_s": 10.0,
            "backend_compile_time_s": 8.0,
            "inductor_compile_time_s": 7.0,
            "code_gen_time_s": 5.0,
        }
    )
    phases = [e for e in events if isinstance(e, PhaseTime)]
    assert [(p.phase, p.parent) for p in phases] == [
        ("dynamo", ""),
        ("backend", ""),
        ("inductor", "backend"),
        ("codegen", "inductor"),
    ]
    # the fuselens compiler's phases arrive without a parent: inside "backend"
    phases.append(nest_phase(PhaseTime("lowering", 0.5, "1/0")))
    assert phases[-1].parent == "backend" and nest_phase(PhaseTime("dynamo", 1.0)).parent == ""
    report = assemble(phases, RunInfo(target="t.py"))
    assert report.timings.compile_s == 10.0  # dynamo + backend, children never added
    assert phase_rows(report) == [  # each child right under its parent
        ("dynamo", 2.0, 0),
        ("backend", 8.0, 0),
        ("inductor", 7.0, 1),
        ("codegen", 5.0, 2),
        ("lowering", 0.5, 1),
    ]
    text = render_terminal(report, color=False)
    assert "\n    └ inductor" in text and "\n      └ codegen" in text and "10.0 s in total" in text


@pytest.mark.slow
def test_inductor_config_override_reaches_the_scheduler_and_recompiled_kernels_are_timed():
    """Two real Inductor compiles in one kept worker (~1-2 min).

    Default config: the mean and the pointwise work on its result fuse into
    one loop nest; both graphs (8 rows, then 5 rows: a recompile with the same
    kernel names) get their own kernel timings. With `max_fusion_size=1`
    Inductor refuses that fusion: the refusal is a not_fused decision naming
    the option, and the C++ kernel holds two row loops instead of one."""
    target = Target.from_cli(["ind_fusion.py"], cwd=CORPUS)
    with WorkerSession(target) as session:
        default = session.run(RunOptions(time_kernels=True, timeout_s=400))
        limited = session.run(RunOptions(inductor_config={"max_fusion_size": 1}, timeout_s=400))
    assert not default.errors and not limited.errors, (default.errors, limited.errors)
    timed = {(k.graph_id, k.name): k.calls for k in default.kernels if k.kind == "cpp"}
    assert sorted(timed) == [("0/0:dynamo", "cpp_fused_mean_mul_relu_sub_0"), ("0/1:dynamo", "cpp_fused_mean_mul_relu_sub_0")]
    assert set(timed.values()) == {2}  # each graph ran twice
    assert [d.decision for d in default.fusion if d.graph_id == "0/0:dynamo"] == ["fused"]
    (refused,) = [d for d in limited.fusion if d.decision == "not_fused" and d.graph_id == "0/0:dynamo"]
    assert refused.rule == "inductor:max_fusion_size" and refused.option == "torch._inductor.config.max_fusion_size"
    assert refused.nodes[0] == "mean" and {loc.line for loc in refused.locations} <= {5, 6}

    def loop_nests(report):
        (kernel,) = [k for k in report.kernels if k.graph_id == "0/0:dynamo" and k.kind == "cpp"]
        return len(re.findall(r"for\(int64_t x0\b", kernel.source)), kernel.source

    (fused_loops, fused_src), (apart_loops, apart_src) = loop_nests(default), loop_nests(limited)
    assert apart_loops > fused_loops, (fused_src, apart_src)
