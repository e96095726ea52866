"""Trust is per folder, with a real `fuselens server` over stdio: a
pyproject.toml above the trusted workspace never makes its entry run, a file
outside the trusted folders runs nothing, named `trustedRoots` trust only
themselves, scratch folders are private and go away with the server, and no
worker outlives a server killed with SIGKILL or SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import time

import pytest
from lsprotocol import types

from pytest_lsp.client import make_test_lsp_client

from lsp_workspaces.harness import SERVER, capabilities, command, open_file, pid_alive, save_file, session, uri, wait_until

PROGRAM = "open({marker!r}, 'w').write('ran')\n"


def _plant(folder, name: str, marker) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(PROGRAM.format(marker=str(marker)))


async def _start(root, init=None):
    """A client whose server the test kills itself (`session` would shut it down)."""
    client = make_test_lsp_client()
    await client.start_io(*SERVER)
    await client.initialize_session(types.InitializeParams(
        capabilities=capabilities(), root_uri=uri(root),
        workspace_folders=[types.WorkspaceFolder(uri=uri(root), name="ws")],
        initialization_options=init or {"trusted": True},
    ))
    return client


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("FUSELENS_CACHE_DIR", str(root))  # the server (a subprocess) inherits it
    return root


async def test_pyproject_above_the_trusted_workspace_never_runs_its_entry(tmp_path, cache):
    outer, ws = tmp_path / "outer", tmp_path / "outer" / "ws"
    evil, own = tmp_path / "evil-ran", tmp_path / "own-ran"
    _plant(outer, "evil.py", evil)
    (outer / "pyproject.toml").write_text('[tool.fuselens]\nentry = "evil.py"\n')
    _plant(ws, "script.py", own)
    async with session(ws) as client:
        doc = open_file(client, ws / "script.py")
        summary = await command(client, "fuselens.analyze", doc)
        assert summary["status"] == "ok", summary
    assert own.exists(), "the trusted file itself should have run"
    assert not evil.exists(), "an entry configured above the trusted folder ran"


async def test_file_outside_every_trusted_folder_runs_nothing_and_says_why(tmp_path, cache):
    ws, other = tmp_path / "ws", tmp_path / "elsewhere"
    marker = tmp_path / "ran"
    ws.mkdir()
    _plant(other, "script.py", marker)
    async with session(ws, init={"trusted": True, "runOn": "open"}) as client:
        doc = open_file(client, other / "script.py")
        save_file(client, other / "script.py")
        summary = await command(client, "fuselens.analyze", doc)
        assert summary == {"status": "outside-trusted-folders"}
        messages = await wait_until(lambda: [m for m in client.messages if "outside every trusted folder" in m.message], 10)
        assert str(other / "script.py") in messages[0].message
    assert not marker.exists()


async def test_entry_pointing_outside_the_trusted_folder_is_refused(tmp_path, cache):
    ws = tmp_path / "ws"
    marker, own = tmp_path / "evil-ran", tmp_path / "own-ran"
    _plant(tmp_path, "evil.py", marker)
    _plant(ws, "script.py", own)
    (ws / "pyproject.toml").write_text('[tool.fuselens]\nentry = "../evil.py"\n')
    async with session(ws) as client:
        doc = open_file(client, ws / "script.py")
        summary = await command(client, "fuselens.analyze", doc)
        assert summary == {"status": "outside-trusted-folders"}
    assert not marker.exists() and not own.exists()


async def test_trusted_roots_trust_the_named_folders_only(tmp_path, cache):
    """A Neovim config names its roots; the client's root (here their parent)
    is not trusted by that."""
    named, beside = tmp_path / "proj", tmp_path / "other"
    in_named, in_beside = tmp_path / "proj-ran", tmp_path / "other-ran"
    _plant(named, "a.py", in_named)
    _plant(beside, "b.py", in_beside)
    async with session(tmp_path, init={"trustedRoots": [str(named)]}) as client:
        assert (await command(client, "fuselens.analyze", open_file(client, named / "a.py")))["status"] == "ok"
        assert (await command(client, "fuselens.analyze", open_file(client, beside / "b.py")))["status"] == "outside-trusted-folders"
    assert in_named.exists() and not in_beside.exists()


async def _report_dir(client, doc) -> str:
    assert (await command(client, "fuselens.analyze", doc))["status"] == "ok"
    written = await command(client, "fuselens.writeReport", doc)
    return os.path.dirname(written["path"])


def _scratch_of(cache, pid: int) -> list[str]:
    """The scratch folders of process `pid` (the server's own, its workers' stack dumps)."""
    parent = cache / "scratch"
    return sorted(n for n in os.listdir(parent) if f"-{pid}-" in n) if parent.is_dir() else []


async def test_scratch_folder_is_private_and_removed_on_shutdown_and_sigterm(tmp_path, cache):
    ws = tmp_path / "ws"
    _plant(ws, "script.py", tmp_path / "ran")
    async with session(ws) as client:
        folder = await _report_dir(client, open_file(client, ws / "script.py"))
        assert folder.startswith(str(cache / "scratch"))
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert not os.path.exists(folder)

    client = await _start(ws)
    try:
        folder = await _report_dir(client, open_file(client, ws / "script.py"))
        pid = (await command(client, "fuselens.serverInfo"))["pid"]
        assert _scratch_of(cache, pid)
        # Idle: nothing wakes the server's event loop. A SIGTERM then used to
        # wait for the next message (the editor keeps stdin open), so the
        # server lived on with its folder.
        await asyncio.sleep(1.0)
        os.kill(pid, signal.SIGTERM)
        await wait_until(lambda: not pid_alive(pid), 5)
        assert _scratch_of(cache, pid) == [], "SIGTERM left scratch folders behind"
    finally:
        await asyncio.wait_for(client.stop(), 15)


async def test_scratch_of_a_sigkilled_server_is_removed_when_the_next_one_starts(tmp_path, cache):
    ws = tmp_path / "ws"
    _plant(ws, "script.py", tmp_path / "ran")
    client = await _start(ws)
    try:
        folder = await _report_dir(client, open_file(client, ws / "script.py"))
        pid = (await command(client, "fuselens.serverInfo"))["pid"]
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: not pid_alive(pid), 15)
        assert os.path.isdir(folder)
    finally:
        await client.stop()
    async with session(ws) as client:
        await command(client, "fuselens.serverInfo")
        assert not os.path.exists(folder)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
async def test_worker_dies_shortly_after_its_server_is_killed(tmp_path, cache, sig):
    ws = tmp_path / "ws"
    ws.mkdir()
    pid_file = tmp_path / "worker.pid"
    (ws / "forever.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True:\n    time.sleep(0.05)\n"
    )
    client = await _start(ws, {"trusted": True, "timeout": 600})
    try:
        doc = open_file(client, ws / "forever.py")
        server_pid = (await command(client, "fuselens.serverInfo"))["pid"]
        pending = asyncio.ensure_future(command(client, "fuselens.analyze", doc, timeout=600))
        await wait_until(lambda: pid_file.exists() and pid_file.read_text(), 120)
        worker = int(pid_file.read_text())
        assert pid_alive(worker)
        os.kill(server_pid, sig)
        killed_at = time.monotonic()
        await wait_until(lambda: not pid_alive(worker), 5)
        assert time.monotonic() - killed_at < 2.0
        pending.cancel()
    finally:
        await client.stop()
