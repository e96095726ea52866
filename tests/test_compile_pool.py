"""The Triton compile workers (fuselens/compiler/compile_pool.py) on CI's CPUs.

What a GPU would launch cannot run here. The workers are started as on a GPU
machine, with the parent's target (sm_90), and never touch CUDA; the parent here
uses the same compile-only driver (`compile_worker.CompileOnlyDriver`). The compiles
are real (Triton's CUDA backend and ptxas). Each scenario runs in a subprocess: the
driver must not leak into other tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch


KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def fl_pool_kernel(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, _twice(tl.load(x + i, mask=i < n)), mask=i < n)
'''

PARENT = '''
import importlib.util, os, sys
from fuselens.compiler.runtime.compile_worker import use_target
use_target("cuda:90:32")  # what the workers compile for, here too: no GPU in CI
import torch
from triton import knobs
from triton.compiler import compiler as tc
from fuselens.compiler.runtime.compile_pool import WORKER_ARGV, CompilePool, backend_hash, specialization, triton_cache_dir

root = {root!r}
knobs.cache.dir = os.path.join(root, "triton")
# this process keys binaries by another ptxas version than a worker computes (as after
# Inductor repoints TRITON_PTXAS_PATH: Triton keeps the version it saw first)
from triton.backends.nvidia.compiler import CUDABackend
CUDABackend.hash = lambda self: "the parent's ptxas version-90"
path = os.path.join(root, "fl_pool_mod.py")
open(path, "w").write({kernel!r})
spec_ = importlib.util.spec_from_file_location("fl_pool_mod", path)
mod = importlib.util.module_from_spec(spec_); sys.modules["fl_pool_mod"] = mod; spec_.loader.exec_module(mod)

pool = CompilePool(2, WORKER_ARGV + ["--target", "cuda:90:32"])
pool.wait_ready(120)
assert pool.ready_count() == 2, "workers not ready"

args = (torch.float32, torch.float32, 1000)
kw = dict(grid=(1,), num_warps=4, BLOCK=256)
spec = specialization(mod.fl_pool_kernel, *args, **kw)
assert spec is not None
def compiled_files():
    return [f for _, _, fs in os.walk(knobs.cache.dir) for f in fs if f.startswith("fl_pool_kernel.") and f.endswith("cubin")]
assert not compiled_files(), "specialization compiled"
fut = pool.submit(path, "fl_pool_kernel", spec, triton_cache_dir(), backend_hash())
res = fut.result(timeout=300)
assert res["ok"], res

def no_compile(*a, **k):
    raise AssertionError("the parent compiled: the worker's binary was not found under the same key")
tc.ASTSource.make_ir = no_compile
if {adopt!r}:
    from triton.runtime.jit import JITFunction
    from fuselens.compiler.runtime.triton_precompile import _adopt_source_hash
    def no_parse(self):
        raise AssertionError("the parent parsed the kernel's source for its hash")
    JITFunction.parse = no_parse
    assert isinstance(res["fn_hash"], str), res
    _adopt_source_hash(mod.fl_pool_kernel, res["fn_hash"])
k = mod.fl_pool_kernel.warmup(*args, **kw)
assert k is not None and len(k.asm["cubin"]) > 0 and len(compiled_files()) == 1
print("WORKER-COMPILED-PARENT-LOADED", round(res["secs"], 3))
pool.close()
'''

DEAD = '''
import sys, time
from fuselens.compiler.runtime.compile_pool import CompilePool
pool = CompilePool(1)  # the real worker: no CUDA driver here, so it reports not ready and exits
w = pool.workers[0]
w.reader.join(timeout=120)
assert w.dead and pool.ready_count() == 0
assert pool.submit("m.py", "k", "{{}}", "/tmp") is None
print("NOT-READY-NO-JOBS")
'''


def _run(src: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=600)


def test_a_worker_compiles_a_kernel_the_parent_then_loads_from_the_cache_without_compiling_even_when_their_ptxas_versions_differ(tmp_path: Path) -> None:
    src = PARENT.format(root=str(tmp_path), kernel=KERNEL, adopt=False)
    r = _run(src)
    assert "WORKER-COMPILED-PARENT-LOADED" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_the_parent_finds_a_workers_binary_with_the_source_hash_the_worker_computed_without_parsing_the_kernel(tmp_path: Path) -> None:
    src = PARENT.format(root=str(tmp_path), kernel=KERNEL, adopt=True)
    r = _run(src)
    assert "WORKER-COMPILED-PARENT-LOADED" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine's workers start")
def test_workers_that_cannot_start_take_no_jobs_so_compiles_stay_in_process() -> None:
    r = _run(textwrap.dedent(DEAD).replace("{{}}", "{}"))
    assert "NOT-READY-NO-JOBS" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


def test_a_job_brings_the_parents_current_triton_variables_to_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # Inductor sets TRITON_PTXAS_PATH in the parent after the workers started; the
    # ptxas version is part of every binary's cache key
    from fuselens.compiler.runtime.compile_worker import _use_env

    monkeypatch.setenv("TRITON_FL_STALE", "1")
    monkeypatch.setenv("FL_NOT_TRITON", "keep")
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    _use_env({"TRITON_PTXAS_PATH": "/opt/ptxas"})
    import os

    assert os.environ.get("TRITON_PTXAS_PATH") == "/opt/ptxas"
    assert "TRITON_FL_STALE" not in os.environ and os.environ["FL_NOT_TRITON"] == "keep"
    monkeypatch.delenv("TRITON_PTXAS_PATH")


def test_compile_workers_zero_never_starts_a_worker() -> None:
    from fuselens.compiler.runtime import compile_pool, triton_precompile
    from fuselens.compiler.options import CompilerOptions

    assert triton_precompile._send_to_workers(None, [object()], CompilerOptions(compile_workers=0), "") is False
    assert compile_pool._pool is None


def test_automatic_worker_count_leaves_two_cpus_to_the_parent_splits_a_host_among_ranks_and_leaves_small_machines_without_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from fuselens.compiler.runtime import compile_pool

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for cpus, n in ((2, 0), (3, 0), (4, 2), (16, 14), (128, 16)):
        monkeypatch.setattr(compile_pool.os, "cpu_count", lambda c=cpus: c)
        assert compile_pool.auto_workers() == n
    # torchrun's ranks on one host share its CPUs: 8 ranks on 128 CPUs get 14 each, on 16 none
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    for cpus, n in ((16, 0), (64, 6), (128, 14)):
        monkeypatch.setattr(compile_pool.os, "cpu_count", lambda c=cpus: c)
        assert compile_pool.auto_workers() == n


BUSY_WORKER = r'''
import json, os, sys, time
print(json.dumps({"ready": True}), flush=True)
while not os.path.exists(sys.argv[1]):  # compiling: the jobs sent meanwhile stay in the pipe
    time.sleep(0.05)
for line in sys.stdin:
    job = json.loads(line)
    print(json.dumps({"id": job["id"], "ok": True}), flush=True)
'''


def test_submitting_more_jobs_than_the_pipe_holds_does_not_wait_for_a_busy_worker(tmp_path: Path) -> None:
    import threading

    from fuselens.compiler.runtime.compile_pool import CompilePool

    done = tmp_path / "done-compiling"
    pool = CompilePool(1, [sys.executable, "-c", BUSY_WORKER, str(done)])
    try:
        assert pool.wait_ready(60) < 60 and pool.ready_count() == 1
        spec = "x" * 4096  # 100 jobs: 400 KB, six times a Linux pipe's buffer
        futs: list = []
        submitting = threading.Thread(target=lambda: futs.extend(pool.submit("m.py", "k", spec, "/tmp")
                                                                  for _ in range(100)), daemon=True)
        submitting.start()
        submitting.join(timeout=60)
        assert not submitting.is_alive(), "submit waited for the busy worker to read its jobs"
        assert len(futs) == 100 and all(f is not None for f in futs)
        done.touch()
        assert all(f.result(timeout=60)["ok"] for f in futs)
    finally:
        done.touch()
        pool.close()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="process priorities are POSIX")
def test_workers_compile_below_the_parents_priority_so_its_next_graph_is_not_slowed() -> None:
    from fuselens.compiler.runtime.compile_pool import WORKER_ARGV, CompilePool

    pool = CompilePool(1, WORKER_ARGV + ["--target", "cuda:90:32"])
    try:
        w = pool.workers[0]
        assert pool.wait_ready(120) < 120 and pool.ready_count() == 1, "worker not ready"
        assert os.getpriority(os.PRIO_PROCESS, w.proc.pid) > os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        pool.close()


EARLY_START = r'''
import torch
import fuselens.compiler
fuselens.compiler.register()
from fuselens.compiler import entry, options
from fuselens.compiler.runtime import compile_pool

started = []
entry._start_compile_workers = lambda opts: started.append(opts.compile_workers)

def f(x):
    return torch.relu(x) + 1

torch.compile(f, backend="eager")(torch.randn(4))
assert started == [], "CUDA not initialized: no workers"
# no GPU here: CUDA initialized is what this stands in for (a model moved to the GPU)
torch.cuda.is_initialized = lambda: True
torch.compile(lambda x: x * 2, backend="eager")(torch.randn(4))
assert started == [-1], started
options.configure(compile_workers=0)
torch.compile(lambda x: x * 3, backend="eager")(torch.randn(4))
assert started == [-1], "compile_workers=0 process-wide: none"
print("EARLY-START-OK")
'''


def test_compile_workers_start_as_dynamo_begins_tracing_in_a_process_on_the_gpu() -> None:
    """The backend's module installs a Dynamo start callback: in a process whose CUDA is
    initialized the workers start before the first frame is traced (not once its graph
    reaches the backend), unless `compile_workers=0` process-wide. CI has no GPU: the
    start itself is recorded instead of made, and CUDA's initialization is stood in for."""
    out = _run(EARLY_START)
    assert "EARLY-START-OK" in out.stdout, out.stdout + out.stderr


PRELUDE_KERNEL = '''
@triton.jit
def fl_prelude_kernel(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + i, mask=i < n)
    tl.store(y + i, _fl_floor(v) * _fl_rsqrt(tl.abs(v) + 1.0), mask=i < n)
'''

TORCH_FREE_PARENT = '''
import json, os, subprocess, sys
from fuselens.compiler.runtime.compile_worker import use_target
use_target("cuda:90:32")
import torch
from triton import knobs
from fuselens.compiler.runtime.compile_pool import backend_hash, specialization, triton_cache_dir
from fuselens.compiler.runtime.launch_config import target_options
from fuselens.compiler.runtime.triton_prelude import prelude_header, prelude_text
from fuselens.private_dirs import cache_dir

knobs.cache.dir = os.path.join({root!r}, "triton")
path = os.path.join(cache_dir("triton"), "fl_torch_free_test.py")
with open(path, "w") as f:
    f.write(prelude_header(prelude_text(False)) + {kernel!r})
os.chmod(path, 0o600)
import importlib.util
spec_ = importlib.util.spec_from_file_location("fl_torch_free_test", path)
mod = importlib.util.module_from_spec(spec_); sys.modules["fl_torch_free_test"] = mod; spec_.loader.exec_module(mod)
spec = specialization(mod.fl_prelude_kernel, torch.float32, torch.float32, 1000, grid=(1,), num_warps=4, BLOCK=256,
                      **target_options())
job = {{"id": 1, "module": path, "name": "fl_prelude_kernel", "spec": spec, "cache_dir": triton_cache_dir(),
        "env": {{}}, "backend_hash": backend_hash()}}
worker = ("import sys\\nfrom fuselens.compiler.runtime import compile_worker as w\\n"
          "w.main(['--target', 'cuda:90:32'])\\n"
          "sys.stderr.write('LOADED torch=%s sympy=%s' % ('torch' in sys.modules, 'sympy' in sys.modules))\\n")
out = subprocess.run([sys.executable, "-c", worker], input=json.dumps(job) + "\\n", capture_output=True, text=True,
                     timeout=300)
lines = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
assert lines[0] == {{"ready": True}}, out.stdout + out.stderr
assert lines[1]["ok"], lines[1]
print(out.stderr.strip().splitlines()[-1])
'''


def test_a_worker_compiles_a_generated_module_with_its_prelude_without_importing_torch_or_sympy(tmp_path: Path) -> None:
    """A worker comes up in the time Triton takes to import: torch (3.5 s on the H200's
    host) and sympy (2 s) were imported through the prelude and the warm-up, and no job
    needs them. The kernel here calls prelude helpers and compiles for sm_90 for real."""
    out = _run(TORCH_FREE_PARENT.format(root=str(tmp_path), kernel=PRELUDE_KERNEL))
    assert "LOADED torch=False sympy=False" in out.stdout, out.stdout + out.stderr
