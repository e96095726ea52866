"""SVG snapshots of the TUI on recorded runs (tests/fixtures/tui_report_*.json
and a py-spy profile), so they are stable: no worker, no clock, no random.

Update after an intended change with
`python -m pytest tests/test_tui_snapshots.py --snapshot-update` and look at
the SVGs in tests/__snapshots__/test_tui_snapshots/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dataclasses

from fuselens.events import Kernel, Report
from fuselens.tui.app import FuselensApp
from fuselens.tui.sampling import parse_speedscope

FIXTURES = Path(__file__).parent / "fixtures"


def recorded_app() -> FuselensApp:
    """Two recorded runs (fusion on, then off) and a host profile."""
    reports = [Report.from_json((FIXTURES / f"tui_report_{n}.json").read_text()) for n in "ab"]
    profile = parse_speedscope(json.loads((FIXTURES / "tui_host_profile.speedscope.json").read_text()),
                               ("/home/user/proj/",))
    return FuselensApp(reports=reports, host_profiles=[None, profile],
                       labels=["backend=fuselens", "backend=fuselens fusion=off"])


@pytest.mark.parametrize("size", [(100, 30), (160, 45)], ids=["100x30", "160x45"])
def test_main_screen_snapshot(snap_compare, size):
    assert snap_compare(recorded_app(), terminal_size=size)


def test_kernel_screen_snapshot_shows_source_and_not_fused_pairs(snap_compare):
    # cpp_add_2 of the fusion-off run: add and mul were not fused, and why.
    async def open_add_kernel(pilot):
        table = pilot.app.query_one("#kernels")
        table.move_cursor(row=table.get_row_index("0/0:dynamo/cpp_add_2"))
        await pilot.press("enter")
        await pilot.pause()

    assert snap_compare(recorded_app(), terminal_size=(140, 36), run_before=open_add_kernel)


def repeated_runs_app() -> FuselensApp:
    """Issue 19.11's views: fusion on twice (so the run-to-run noise is
    measured: extern_mm_0 swings by 40%), then fusion off, with a recompile
    that made a kernel of the same name in another graph, timed extern
    matmuls, and py-spy function names long enough to crowd the host panel."""
    a, b = (Report.from_json((FIXTURES / f"tui_report_{n}.json").read_text()) for n in "ab")
    a2 = Report.from_json(a.to_json())
    for k in a2.kernels:
        k.total_time_us = {"extern_mm_0": 1100.0, "cpp_fused_sum_2": 190.0, "cpp_fused_mean_0": 23.0}.get(
            k.name, k.total_time_us)
    # vs run 2: extern_mm_0 +695 µs (noise 740: "~"), cpp_fused_sum_2 +11 µs (noise 2: shown),
    # cpp_fused_mean_0 +0.2 µs (noise 1.4: "~")
    b.kernels.append(Kernel(name="cpp_fused_mean_0", kind="cpp", graph_id="1/1:dynamo", ops=["aten.mean.dim"],
                            calls=8, total_time_us=19.0))
    profile = parse_speedscope(json.loads((FIXTURES / "tui_host_profile.speedscope.json").read_text()),
                               ("/home/user/proj/",))
    long_names = {"run": "run_and_compare_every_guard_of_the_frame_with_a_long_name",
                  "schedule": "Scheduler._fuse_candidates_by_score_and_memory_footprint"}
    profile.functions = [dataclasses.replace(f, function=long_names.get(f.function, f.function))
                         for f in profile.functions]
    on, off = "backend=fuselens", "backend=fuselens fusion=off"
    return FuselensApp(reports=[a, a2, b], host_profiles=[None, None, profile], labels=[on, on, off])


def test_repeated_runs_snapshot_160x40_graph_column_noise_and_py_spy_numbers(snap_compare):
    # issue 19.11 at 160 columns: the graph column tells the two cpp_fused_mean_0 apart,
    # differences within the run-to-run noise read "~", the py-spy numbers stay in view
    assert snap_compare(repeated_runs_app(), terminal_size=(160, 40))
