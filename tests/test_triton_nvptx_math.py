"""The prelude's NVIDIA forms (runtime/triton_prelude.py PTX_HELPERS): sin/cos on
`runtime/nvptx_math.ll`, and floor, ceil and rsqrt without libdevice, compiled for
sm_90 on CI's CPUs.

CI cannot run what it compiles for the GPU: the values are checked on the device
(benchmarks/gpu_check.py: the OpInfo subset and `sincos_full_range`, sin, cos and
sin^2+cos^2 over the whole float range, inf and nan, against eager's CUDA sinf/cosf).
Here the compiles are real (Triton's CUDA backend, LLVM linking, ptxas), in a
subprocess with the compile workers' compile-only driver, as a GPU machine runs
them: in process, and in a worker, which imports the graph's module and its prelude
module on its own and whose Triton options must carry the library too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = '''
import importlib.util, os, sys
from fuselens.compiler.runtime.compile_worker import use_target
use_target("cuda:90:32")
import torch
from triton import knobs
from triton._C.libtriton import llvm
from triton.compiler import compiler as tc
from fuselens.compiler.runtime.triton_prelude import NVPTX_MATH_LIB, prelude_header, prelude_text
from fuselens.compiler.runtime.compile_pool import WORKER_ARGV, CompilePool, backend_hash, specialization, triton_cache_dir
from fuselens.compiler.runtime.launch_config import LaunchConfig

root = {root!r}
knobs.cache.dir = os.path.join(root, "triton")
# what the generator prints for sin(x)**2 + cos(x)**2 (one shared reduction), and a
# kernel of the other helpers
KERNELS = """
@triton.jit
def fl_sincos_kernel(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, mask=xmask)
    tmp1, tmp2 = _fl_sincos(tmp0)
    tl.store(out_ptr0 + xindex, tmp1 * tmp1 + tmp2 * tmp2, mask=xmask)


@triton.jit
def fl_round_kernel(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, mask=xmask)
    tmp1 = _fl_floor(tmp0) + _fl_ceil(tmp0) * _fl_rsqrt(tl.abs(tmp0) + 1e-5) + _fl_round(tmp0)
    tl.store(out_ptr0 + xindex, tmp1, mask=xmask)
"""
path = os.path.join(root, "fl_sc_mod.py")
# as the generator writes a graph's module: the prelude a module of its own beside it
open(path, "w").write(prelude_header(prelude_text(interpret=False)) + KERNELS)
spec_ = importlib.util.spec_from_file_location("fl_sc_mod", path)
mod = importlib.util.module_from_spec(spec_); sys.modules["fl_sc_mod"] = mod; spec_.loader.exec_module(mod)
linked = []  # what Triton's linker is finally given
link = llvm.link_extern_libs
def spy(m, paths):
    linked.append(list(paths))
    return link(m, paths)
llvm.link_extern_libs = spy
args = (torch.float32, torch.float32, 1 << 20)
kw = dict(grid=(1,), **LaunchConfig(1024, 1, 4).compile_kwargs("pointwise"))  # installs the link filter over it
ptx = mod.fl_sincos_kernel.warmup(*args, **kw).asm["ptx"]
print("SINCOS_LINKED", linked == [[NVPTX_MATH_LIB]])
print("FUNC", "__fl_sincos_large" in ptx and ".func" in ptx)
print("CALLS", ptx.count("call.uni"))
print("BARRIERS", ptx.count("bar.sync") + ptx.count("barrier.sync"))
print("LIBDEVICE", "__nv_" in ptx)
linked.clear()
ptx = mod.fl_round_kernel.warmup(*args, **kw).asm["ptx"]
print("ROUND_LINKED", linked == [])
print("ROUND_PTX", "cvt.rmi.f32.f32" in ptx and "cvt.rpi.f32.f32" in ptx and "rsqrt.approx.f32" in ptx)

pool = CompilePool(1, WORKER_ARGV + ["--target", "cuda:90:32"])
pool.wait_ready(120)
assert pool.ready_count() == 1, "worker not ready"
kw512 = dict(grid=(1,), **LaunchConfig(512, 1, 4).compile_kwargs("pointwise"))
spec = specialization(mod.fl_sincos_kernel, *args, **kw512)
res = pool.submit(path, "fl_sincos_kernel", spec, triton_cache_dir(), backend_hash()).result(timeout=300)
pool.close()
print("WORKER", res["ok"] or res)
def no_compile(*a, **k):
    raise AssertionError("the parent compiled: the worker built another kernel")
tc.ASTSource.make_ir = no_compile
ptx = mod.fl_sincos_kernel.warmup(*args, **kw512).asm["ptx"]
print("WORKER_FUNC", "__fl_sincos_large" in ptx and ptx.count("call.uni") == 4)
'''


def test_nvidia_helpers_link_only_what_they_call_and_sincos_calls_one_compiled_large_argument_reduction(
        tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(tmp_path))],
                       capture_output=True, text=True, timeout=600)
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert r.returncode == 0 and out, r.stdout[-2000:] + r.stderr[-4000:]
    assert out["SINCOS_LINKED"] == "True"  # nvptx_math.ll only: libdevice is not parsed
    assert out["FUNC"] == "True"  # the reduction compiled once, as a function of its own
    assert out["CALLS"] == "8"  # called at each of a thread's 8 elements (1024 elements, 4 warps)
    assert out["BARRIERS"] == "0"  # no block-wide test of the arguments
    assert out["LIBDEVICE"] == "False"  # never libdevice's sinf/cosf
    assert out["ROUND_LINKED"] == "True"  # floor, ceil, rsqrt: no library linked at all
    assert out["ROUND_PTX"] == "True"
    assert out["WORKER"] == "True"  # a worker's compile links the library too
    assert out["WORKER_FUNC"] == "True"  # 512 elements, 4 warps: 4 calls a thread
