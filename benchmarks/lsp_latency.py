"""Language server latency: save -> diagnostics on examples/demo.py.

    python benchmarks/lsp_latency.py [--runs 3] [--file examples/demo.py]

Measures, with a real LSP client and a real `fuselens server`:
- the program's own run time (`python demo.py`, best of --runs),
- cold: didSave -> publishDiagnostics when the server has no cached result
  (one fresh server per run, so every run is cold),
- cached: a second didSave of the unchanged file -> publishDiagnostics.
Goals (issue 4): cold <= program time + 1 s, cached <= 200 ms.
Not a test: prints a Markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import statistics
import subprocess
import sys
import time

from lsprotocol import types
from pytest_lsp import client_capabilities
from pytest_lsp.client import make_test_lsp_client

ROOT = pathlib.Path(__file__).resolve().parent.parent


def program_time(path: pathlib.Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(path)], cwd=path.parent, capture_output=True, check=False)
    return time.perf_counter() - start


def analyze_time(path: pathlib.Path) -> float:
    """The capture worker alone (what the server awaits), no LSP."""
    from fuselens.capture import RunOptions, Target, analyze

    start = time.perf_counter()
    analyze(Target("script", str(path), [], str(path.parent)), RunOptions(timeout_s=300))
    return time.perf_counter() - start


async def wait_new_publish(client, uri: str, before, timeout: float = 300.0) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if client.diagnostics.get(uri) is not before and uri in client.diagnostics:
            return time.perf_counter()
        await asyncio.sleep(0.002)
    raise TimeoutError("no diagnostics")


async def one_server(path: pathlib.Path) -> tuple[float, float, int]:
    client = make_test_lsp_client()

    # VS Code's capabilities include code lens / inlay hint refresh: answer them as it would
    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def _lens_refresh(params: None) -> None:
        return None

    @client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)
    def _hint_refresh(params: None) -> None:
        return None

    await client.start_io(sys.executable, "-m", "fuselens", "server")
    caps = client_capabilities("visual-studio-code")
    caps.text_document.diagnostic = None  # push, as Neovim and older VS Code clients get
    await client.initialize_session(
        types.InitializeParams(capabilities=caps, root_uri=path.parent.as_uri(), initialization_options={"trusted": True})
    )
    uri = path.as_uri()
    try:
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, path.read_text()))
        )
        await asyncio.sleep(0.5)
        timings = []
        for _ in range(2):  # cold, then cached
            before = client.diagnostics.get(uri)
            start = time.perf_counter()
            client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri)))
            timings.append(await wait_new_publish(client, uri, before) - start)
        return timings[0], timings[1], len(client.diagnostics.get(uri, []))
    finally:
        await client.shutdown_session()
        await client.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--file", default=str(ROOT / "examples" / "demo.py"))
    args = parser.parse_args()
    path = pathlib.Path(args.file).resolve()
    own = min(program_time(path) for _ in range(args.runs))
    worker = min(analyze_time(path) for _ in range(args.runs))
    cold, cached, count = [], [], 0
    for _ in range(args.runs):
        c, h, count = asyncio.run(one_server(path))
        cold.append(c)
        cached.append(h)
    med = statistics.median
    print(f"| measure ({path.name}, {args.runs} runs, {count} diagnostics) | seconds |")
    print("|---|---|")
    print(f"| program alone (`python {path.name}`, best) | {own:.2f} |")
    print(f"| capture worker alone (`fuselens.capture.analyze`, best) | {worker:.2f} |")
    print(f"| cold save -> diagnostics (median, min) | {med(cold):.2f} ({min(cold):.2f}) |")
    print(f"| server overhead over the worker (best cold - best worker) | {min(cold) - worker:+.2f} |")
    print(f"| cold overhead over the program (median) | {med(cold) - own:+.2f} (goal <= 1.00) |")
    print(f"| cached save -> diagnostics (median, max) | {med(cached) * 1000:.0f} ms ({max(cached) * 1000:.0f} ms) (goal <= 200 ms) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
