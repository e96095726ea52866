"""The HTML report in a real browser: headless Chromium opens the single
file offline, builds a DOM with the charts and graph pictures, and paints a
page that is not blank. Skips (saying why) where no Chromium is installed:
`apt-get install -y chromium`."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from fuselens.report.html import render_html
from report_helpers import demo_report

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install -y chromium)")


def chromium(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"  # a fresh profile: nothing cached, nothing shared
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=False, timeout=120, cwd=tmp_path)


def png_ink(path) -> tuple[int, int, float]:
    """(width, height, share of non-zero bytes in the filtered pixel rows):
    a blank white page is ~0.0003, a page with text and pictures ~0.03."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    i, idat, width, height = 8, b"", 0, 0
    while i < len(data):
        (n,) = struct.unpack(">I", data[i:i + 4])
        kind, body = data[i + 4:i + 8], data[i + 8:i + 8 + n]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        i += 12 + n
    raw = zlib.decompress(idat)
    return width, height, sum(1 for b in raw if b) / len(raw)


def test_html_report_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_html(demo_report()), encoding="utf-8")
    url = "file://" + os.path.abspath(page)

    dom = chromium(["--dump-dom", url], tmp_path)
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    html = dom.stdout.decode("utf-8", errors="replace")
    # the browser parsed the inline SVGs into the DOM: 2 charts + 2 graphs
    assert html.count("<svg") >= 4
    assert 'class="node fl-node fl-k' in html  # graph nodes carry their kernel class
    assert "Where the time went" in html

    shot = tmp_path / "shot.png"
    proc = chromium(["--window-size=1280,2400", f"--screenshot={shot}", url], tmp_path)
    assert proc.returncode == 0 and shot.exists(), proc.stderr.decode(errors="replace")[-2000:]
    width, height, ink = png_ink(shot)
    assert (width, height) == (1280, 2400)
    assert ink > 0.005, f"the page looks blank (ink {ink:.4f})"


def test_wide_fusion_and_kernel_tables_do_not_widen_the_page_at_1400px(tmp_path):
    import copy

    r = copy.deepcopy(demo_report())
    blocked = next(d for d in r.fusion if d.decision == "not_fused")
    blocked.nodes = ["buf_" + "x" * 150, "buf_" + "y" * 150]
    blocked.reason = "reduction_" + "z" * 180
    r.kernels[0].name = "cpp_fused_" + "k" * 180
    # the page writes its own width into the DOM, which --dump-dom returns
    probe = ("<script>document.body.setAttribute('data-width', "
             "document.documentElement.scrollWidth + 'x' + window.innerWidth)</script></body>")
    page = tmp_path / "wide.html"
    page.write_text(render_html(r).replace("</body>", probe), encoding="utf-8")
    dom = chromium(["--window-size=1400,900", "--dump-dom", "file://" + os.path.abspath(page)], tmp_path)
    assert dom.returncode == 0, dom.stderr.decode(errors="replace")[-2000:]
    scroll, inner = (int(n) for n in re.search(rb'data-width="(\d+)x(\d+)"', dom.stdout).groups())
    assert scroll <= inner, f"the page scrolls sideways: {scroll} px wide in a {inner} px window"
