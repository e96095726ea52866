"""Every bad input gives a report with a clear error entry, and the caller
survives; plus the runner's other promises (module targets, max_calls,
kept sessions, cancellation, bounded output). Runs start in parallel once
per module (the worker's torch import dominates their cost)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time

import pytest

from fuselens.capture import RunOptions, Target, WorkerSession, analyze, analyze_async

CORPUS = os.path.join(os.path.dirname(__file__), "corpus")
LIMIT = 4096

RUNS = {
    "raises": (["bad_raises.py"], RunOptions()),
    "exit3": (["bad_exit3.py"], RunOptions()),
    "hang": (["bad_hang.py"], RunOptions(timeout_s=4)),
    "sigkill": (["bad_sigkill.py"], RunOptions()),
    "loud": (["bad_loud.py"], RunOptions(output_limit_bytes=LIMIT)),
    "syntax": (["bad_syntax.py"], RunOptions()),
    "latin1": (["bad_latin1.py"], RunOptions()),
    "garbage": (["bad_garbage_events.py"], RunOptions()),
    "train": (["train_loop.py", "--", "1000"], RunOptions(max_calls=3)),
    "module": (["-m", "corpus_pkg.run", "--", "a", "b"], RunOptions()),
}


@pytest.fixture(scope="module")
def runs():
    def one(item):
        key, (argv, options) = item
        started = time.monotonic()
        report = analyze(Target.from_cli(argv, cwd=CORPUS), options)
        return key, (report, time.monotonic() - started)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        return dict(pool.map(one, RUNS.items()))


def p(name: str) -> str:
    return os.path.join(CORPUS, name)


def test_program_that_raises_reports_exception_at_the_raising_user_line(runs):
    report, _ = runs["raises"]
    (err,) = report.errors
    assert err.kind == "exception" and err.message == "FileNotFoundError: no weights at weights.pt"
    assert (err.location.file, err.location.line, err.location.function) == (p("bad_raises.py"), 5, "load")
    assert "fuselens" not in err.traceback and "runpy" not in err.traceback
    assert report.run.exit_code == 1 and len(report.graphs) == 1  # what ran before the error is kept


def test_sys_exit_3_reports_exit_with_code_and_line(runs):
    report, _ = runs["exit3"]
    (err,) = report.errors
    assert (err.kind, err.message, err.location.line) == ("exit", "sys.exit(3)", 4)
    assert report.run.exit_code == 3 and "about to exit" in report.run.stdout_tail


def test_hanging_program_is_killed_at_the_timeout(runs):
    report, seconds = runs["hang"]
    (err,) = report.errors
    assert err.kind == "timeout" and "4 s" in err.message
    assert seconds < 4 + 45  # worker startup (torch import, ~5-25 s on 2 loaded cores) plus the timeout, not forever
    assert "hanging" in report.run.stdout_tail


def test_program_that_sigkills_itself_is_reported_killed(runs):
    report, _ = runs["sigkill"]
    (err,) = report.errors
    assert err.kind == "killed" and "SIGKILL" in err.message
    assert report.run.exit_code == -9 and "killing myself" in report.run.stdout_tail


def test_megabytes_of_output_keep_only_a_bounded_tail(runs):
    report, _ = runs["loud"]
    assert not report.errors and report.run.exit_code == 0
    assert len(report.run.stdout_tail.encode()) <= LIMIT and report.run.stdout_tail.endswith("END-OF-OUTPUT\n")
    assert 0 < len(report.run.stderr_tail.encode()) <= LIMIT


def test_output_tail_waits_for_the_end_marker_even_when_split_across_reads():
    # `__done__` can arrive on the events pipe before the drain thread read the program's
    # last output (seen once in CI-like runs: the tail lacked END-OF-OUTPUT); the tail is
    # complete only once the worker's end marker came through, and the marker is stripped.
    import threading

    from fuselens.capture.protocol import OUTPUT_END
    from fuselens.capture.runner import _Tail

    tail = _Tail(64)
    tail.feed(b"x" * 100)
    assert not tail.wait_end(0.01)
    half = len(OUTPUT_END) // 2
    later = threading.Timer(0.2, lambda: (tail.feed(b"END\n" + OUTPUT_END[:half]), tail.feed(OUTPUT_END[half:])))
    later.start()
    assert tail.wait_end(5.0)
    assert tail.text().endswith("END\n") and len(tail.text()) <= 64 and "\x1e" not in tail.text()


def test_syntax_error_is_reported_with_its_line(runs):
    report, _ = runs["syntax"]
    (err,) = report.errors
    assert err.kind == "syntax" and "expected ':'" in err.message
    assert (err.location.file, err.location.line) == (p("bad_syntax.py"), 4)


def test_latin1_source_without_coding_line_is_a_syntax_error_as_in_cpython(runs):
    report, _ = runs["latin1"]
    (err,) = report.errors
    assert err.kind == "syntax" and err.message.startswith("SyntaxError: Non-UTF-8 code starting with '\\xe9'")
    assert "no encoding declared" in err.message
    assert (err.location.file, err.location.line) == (p("bad_latin1.py"), 4)
    assert report.run.exit_code == 1 and "caf" not in report.run.stdout_tail  # nothing of it ran


def test_run_info_names_the_target_as_the_user_wrote_it(runs):
    assert runs["raises"][0].run.target == "bad_raises.py"  # not the absolute path
    assert runs["train"][0].run.target == "train_loop.py" and runs["train"][0].run.args == ["1000"]
    assert runs["module"][0].run.target == "-m corpus_pkg.run"


def test_malformed_worker_lines_are_counted_not_fatal(runs):
    report, _ = runs["garbage"]
    assert [e.kind for e in report.errors] == ["internal"] and "3 malformed" in report.errors[0].message
    assert [g.location.line for g in report.graph_breaks] == [13]
    assert report.run.exit_code == 0


def test_max_calls_stops_a_training_loop_early(runs):
    report, _ = runs["train"]
    assert report.run.max_calls_reached and report.run.exit_code == 0 and not report.errors
    assert "finished all steps" not in report.run.stdout_tail
    assert report.graphs


def test_module_target_runs_as_main_with_its_arguments(runs):
    report, _ = runs["module"]
    assert "argv ['a', 'b']" in report.run.stdout_tail
    assert [(g.location.file, g.location.line) for g in report.graph_breaks] == [(p("corpus_pkg/run.py"), 7)]
    assert report.run.target == "-m corpus_pkg.run" and report.run.target_kind == "module"


def test_session_reruns_in_the_same_process_with_a_forced_backend():
    with WorkerSession(Target.from_cli(["rc_dtype.py"], cwd=CORPUS)) as session:
        first = session.run(RunOptions())
        pid = session.pid
        second = session.run(RunOptions(backend="aot_eager"))
        assert session.pid == pid  # no new Python, no second torch import
    assert {g.backend for g in first.graphs} == {"eager"}
    assert {g.backend for g in second.graphs} == {"aot_eager"} and second.run.backend == "aot_eager"
    # torch._dynamo.reset() between runs: the same recompile is seen again
    assert [r.compile_id for r in second.recompiles] == [r.compile_id for r in first.recompiles] == ["0/1"]


async def test_cancelling_analyze_async_kills_the_worker_promptly(tmp_path):
    pid_file = tmp_path / "pid"
    target = Target.from_cli(["write_pid_and_hang.py", "--", str(pid_file)], cwd=CORPUS)
    task = asyncio.ensure_future(analyze_async(target, RunOptions()))
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the program never started"
        await asyncio.sleep(0.1)
    pid = int(pid_file.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cancelled_at = time.monotonic()
    while time.monotonic() - cancelled_at < 5:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.05)
    pytest.fail("the user program still runs 5 s after cancel")


async def test_analyze_async_streams_events_on_the_loop():
    seen = []
    report = await analyze_async(Target.from_cli(["gb_print.py"], cwd=CORPUS), RunOptions(), on_event=seen.append)
    assert any(type(e).__name__ == "GraphBreak" for e in seen)
    assert report.graph_breaks and report.run.exit_code == 0


@pytest.mark.slow
def test_inductor_kernels_carry_fused_ops_user_lines_source_and_time():
    """Inductor compile (~40 s on 2 cores): kernels come from the trace's
    output code and provenance artifacts, times from the profiler."""
    demo = os.path.join(os.path.dirname(__file__), "..", "examples", "demo.py")
    report = analyze(Target.from_cli([demo, "--", "inductor"]), RunOptions(time_kernels=True, timeout_s=400))
    assert not report.errors, report.errors
    pointwise = [k for k in report.kernels if k.kind == "cpp" and "gelu" in k.name]
    assert pointwise and "aten.erf.default" in pointwise[0].ops and "extern \"C\"" in pointwise[0].source
    assert {loc.line for loc in pointwise[0].source_lines} >= {42}  # gelu(h * w + b) line
    assert any(k.kind == "extern" and "addmm" in k.name for k in report.kernels)
    # the recompiled graph (0/1) has the same kernel names: each graph's
    # kernels and library calls get their own calls and time
    for gid in ("0/0:dynamo", "0/1:dynamo"):
        ran = [k for k in report.kernels if k.graph_id == gid and k.kind in ("cpp", "extern")]
        # each graph ran once; `extern_kernels.bmm` is both matmuls of the attention
        calls = {k.name: k.calls for k in ran}
        assert calls and all(k.total_time_us > 0 for k in ran) and calls["cpp_fused_native_layer_norm_0"] == 1, calls
        assert calls["extern_kernels.addmm"] == 1 and calls["extern_kernels.bmm"] == 2, calls
    assert any(d.decision == "fused" and d.kernel == pointwise[0].name for d in report.fusion)
    graph = report.graphs[0]
    assert any(n.kernel == pointwise[0].name for n in graph.nodes)


@pytest.mark.slow
def test_demo_defaults_to_the_fuselens_backend_with_kernels_fusion_and_timed_recompiles():
    """`fuselens report examples/demo.py` out of the box (~30 s): the graph
    break and the recompile stay, the fuselens compiler adds kernels and
    fusion decisions, and the recompiled graph's kernels are timed too."""
    demo = os.path.join(os.path.dirname(__file__), "..", "examples", "demo.py")
    report = analyze(Target.from_cli([demo]), RunOptions(time_kernels=True, timeout_s=300))
    assert not report.errors, report.errors
    assert {g.backend for g in report.graphs} == {"fuselens"}
    assert [gb.location.line for gb in report.graph_breaks] == [43]
    first = next(r for r in report.recompiles if r.compile_id == "0/1")
    assert "size mismatch at dim 0: 4 -> 7" in first.reasons[0]
    assert first.call_site is not None and first.call_site.line == 52 and first.call_site.function == "main"
    for gid in ("0/0:aot_inference", "0/1:aot_inference"):
        kernels = [k for k in report.kernels if k.graph_id == gid and k.kind == "cpp"]
        assert kernels and all(k.calls == 1 and k.total_time_us > 0 for k in kernels), (gid, kernels)
    assert any(d.decision == "fused" for d in report.fusion) and any(d.decision == "not_fused" for d in report.fusion)
    nested = {p.phase: p.parent for p in report.timings.phases if p.parent}
    assert nested.get("lowering") == "backend" and nested.get("codegen") == "backend"
