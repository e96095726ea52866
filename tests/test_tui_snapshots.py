"""SVG snapshots of the TUI on recorded runs (tests/fixtures/tui_report_*.json
and a py-spy profile), so they are stable: no worker, no clock, no random.

Update after an intended change with
`python -m pytest tests/test_tui_snapshots.py --snapshot-update` and look at
the SVGs in tests/__snapshots__/test_tui_snapshots/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fuselens.events import Report
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
