"""A second local account cannot make fuselens run its code or read its scratch
files: caches and scratch live in the user's own 0700 folder, and whatever
another uid owns or could write is refused before it is imported or loaded.

The tests run as root, so "another account" is real: files and folders are
`os.chown`-ed to uid 4242 (root may), or left writable by everyone."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import types

import pytest

from fuselens import private_dirs
from fuselens.private_dirs import UnsafePathError

OTHER_UID = 4242

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting a file of another uid needs root (chown)")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("FUSELENS_CACHE_DIR", str(root))
    private_dirs._checked.clear()
    yield root
    private_dirs._checked.clear()


def _env(cache_root) -> dict:
    return dict(os.environ, FUSELENS_CACHE_DIR=str(cache_root), TRITON_INTERPRET="1")


def test_cache_root_defaults_to_xdg_cache_home_then_home_never_tmp(monkeypatch, tmp_path):
    monkeypatch.delenv("FUSELENS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert private_dirs.cache_root() == str(tmp_path / "xdg" / "fuselens")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert private_dirs.cache_root() == str(tmp_path / "home" / ".cache" / "fuselens")


def test_cache_folders_are_created_0700(cache):
    made = private_dirs.cache_dir("triton")
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700


@needs_root
def test_triton_prelude_planted_by_another_account_is_refused_and_never_runs(cache, tmp_path):
    """The reported attack: another account creates the prelude folder first and
    puts a module of its own there; the user's compile worker imported it."""
    marker = tmp_path / "pwned"
    script = textwrap.dedent(f"""
        import os
        from fuselens.compiler.runtime import triton_prelude as tp
        from fuselens.private_dirs import cache_root
        name = tp.prelude_file_name(tp.prelude_text(True))
        folder = os.path.join(cache_root(), "triton_prelude")
        os.makedirs(folder)
        with open(os.path.join(folder, name), "w") as f:
            f.write("open({str(marker)!r}, 'w').write('ran')\\n")
        os.chown(os.path.join(folder, name), {OTHER_UID}, {OTHER_UID})
        os.chown(folder, {OTHER_UID}, {OTHER_UID})
        try:
            tp.warm_prelude()
        except PermissionError as exc:
            print("REFUSED", exc)
        """)
    proc = subprocess.run([sys.executable, "-c", script], env=_env(cache), capture_output=True, text=True, timeout=120)
    assert "REFUSED" in proc.stdout and f"belongs to uid {OTHER_UID}" in proc.stdout, proc.stdout + proc.stderr
    assert not marker.exists(), "a module planted by another account ran"


@needs_root
def test_module_of_another_uid_inside_our_own_folder_is_not_imported(cache, tmp_path):
    marker = tmp_path / "pwned"
    script = textwrap.dedent(f"""
        import os
        from fuselens.compiler.runtime import triton_prelude as tp
        from fuselens.private_dirs import cache_dir
        folder = cache_dir("triton_prelude")   # ours, 0700
        name = tp.prelude_file_name(tp.prelude_text(True))
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write("open({str(marker)!r}, 'w').write('ran')\\n")
        os.chown(path, {OTHER_UID}, {OTHER_UID})
        try:
            tp.warm_prelude()
        except PermissionError as exc:
            print("REFUSED", exc)
        """)
    proc = subprocess.run([sys.executable, "-c", script], env=_env(cache), capture_output=True, text=True, timeout=120)
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert not marker.exists()


def test_prelude_is_written_and_imported_from_the_private_cache(cache):
    proc = subprocess.run(
        [sys.executable, "-c", "from fuselens.compiler.runtime import triton_prelude as tp; tp.warm_prelude(); print('OK')"],
        env=_env(cache), capture_output=True, text=True, timeout=120,
    )
    assert proc.stdout.strip() == "OK", proc.stderr[-2000:]
    (module,) = (cache / "triton_prelude").iterdir()
    assert module.name.startswith("fl_prelude_") and stat.S_IMODE((cache / "triton_prelude").stat().st_mode) == 0o700


def _cpp_options(cache_dir: str):
    return types.SimpleNamespace(cxx="g++", vector_width=0, extra_cflags=(),
                                 resolved_cache_dir=lambda: private_dirs.private_dir(cache_dir))


@needs_root
def test_shared_library_planted_by_another_account_is_not_loaded(cache):
    from fuselens.compiler.runtime import cpp_build as build

    options = _cpp_options(str(cache / "cpp"))
    source = 'extern "C" int fl_answer() { return 42; }\n'
    path = build.library_path(source, options)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"\x7fELF planted")
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafePathError, match=f"belongs to uid {OTHER_UID}"):
        build.build(source, options)


def test_world_writable_parent_folder_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by every account and not sticky: our folder could be swapped
    monkeypatch.setenv("FUSELENS_CACHE_DIR", str(shared / "fuselens"))
    private_dirs._checked.clear()
    with pytest.raises(UnsafePathError, match="can be changed by other accounts"):
        private_dirs.cache_dir("triton")
    assert not (shared / "fuselens").exists()


def test_our_own_cache_folder_left_readable_is_tightened_to_0700(cache):
    cache.mkdir(mode=0o755)
    cache.chmod(0o777)
    private_dirs.cache_dir()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_file_writable_by_others_is_refused(cache):
    folder = private_dirs.cache_dir("triton")
    path = os.path.join(folder, "fl_x.py")
    with open(path, "w") as f:
        f.write("x = 1\n")
    os.chmod(path, 0o666)
    with pytest.raises(UnsafePathError, match="other accounts can write it"):
        private_dirs.check_private_file(path)


def test_scratch_folder_is_0700_and_removed_when_its_process_exits(cache):
    script = "from fuselens import private_dirs; print(private_dirs.scratch_dir('t'))"
    proc = subprocess.run([sys.executable, "-c", script], env=_env(cache), capture_output=True, text=True, timeout=60)
    path = proc.stdout.strip()
    assert path.startswith(str(cache / "scratch")) and not os.path.exists(path)


def test_scratch_of_a_killed_process_is_removed_by_the_next_start(cache):
    script = "import os, time; from fuselens import private_dirs; print(private_dirs.scratch_dir('t'), flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], env=_env(cache), stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    live = private_dirs.scratch_dir("mine")
    proc.kill()
    proc.wait()
    assert os.path.isdir(path), "SIGKILL gives no chance to clean up"
    removed = private_dirs.clean_stale_scratch()
    assert removed == [path] and not os.path.exists(path)
    assert os.path.isdir(live), "a live process's scratch folder was removed"
    private_dirs.remove_scratch(live)


@needs_root
def test_another_account_can_neither_list_nor_read_our_scratch_files(tmp_path, monkeypatch):
    """uid 4242 runs real `ls` and `cat` on a scratch file written with the
    default mode, as the server writes its reports. Every folder above the
    scratch folder lets it through (a 0755 folder in /tmp, not pytest's 0700
    one), so only the scratch folder's own 0700 stops it; the same file in an
    open folder beside it is read, which shows the probe works."""
    import tempfile

    top = tempfile.mkdtemp(prefix="fuselens-second-account-")
    try:
        os.chmod(top, 0o755)
        monkeypatch.setenv("FUSELENS_CACHE_DIR", os.path.join(top, "cache"))
        private_dirs._checked.clear()
        scratch = private_dirs.scratch_dir("lsp")
        os.chmod(os.path.dirname(scratch), 0o755)  # even with <cache>/scratch itself left open
        os.chmod(os.path.dirname(os.path.dirname(scratch)), 0o755)
        secret = os.path.join(scratch, "report.html")
        with open(secret, "w") as f:
            f.write("secret kernel source")
        open_dir = os.path.join(top, "open")
        os.mkdir(open_dir, 0o755)
        readable = os.path.join(open_dir, "report.html")
        with open(readable, "w") as f:
            f.write("secret kernel source")

        def as_other(*cmd: str) -> subprocess.CompletedProcess:
            return subprocess.run(list(cmd), user=OTHER_UID, group=OTHER_UID, extra_groups=[],
                                  capture_output=True, text=True, timeout=30)

        assert as_other("/bin/cat", readable).stdout == "secret kernel source"
        listing, reading = as_other("/bin/ls", scratch), as_other("/bin/cat", secret)
        assert listing.returncode != 0 and "Permission denied" in listing.stderr
        assert reading.returncode != 0 and "Permission denied" in reading.stderr and not reading.stdout
        private_dirs.remove_scratch(scratch)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        private_dirs._checked.clear()
