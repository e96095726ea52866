"""sin(x)^2 + cos(x)^2 over 64M float32 on the GPU with each way of computing sin and
cos, at several block shapes (one process, `do_bench`): run time, registers a thread,
Triton compile time with a fresh cache, and the max error against float64 over the
whole float range. The modes:

0. libdevice's sinf and cosf (`tl.sin`, `tl.cos`), what Inductor emits;
1. the earlier generator's `_fl_sincos`: Cody-Waite for |x| <= 8192, libdevice for a
   block holding larger values;
2. the same with a large-argument reduction of its own, its 2/pi table as a tree of
   selects (measured, then replaced by 3);
3. the generator's `_fl_sincos` of the fourth to sixth sessions (the prelude's portable
   form, still the interpreter's): the large-argument window cut from three uint64
   words by shifts, in Triton, taken by a block holding any |x| > 8192;
4. the Cody-Waite path alone, wrong past |x| = 8192: what the large path costs;
5. the generator's `_fl_sincos` on NVIDIA now: per element, |x| > 8192 calls the one
   compiled copy of the same reduction in `runtime/nvptx_math.ll`.

    python -m benchmarks.gpu_sincos_variants
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from fuselens.compiler.codegen.triton_ops import MathMode
from fuselens.compiler.runtime.triton_prelude import compile_options
from fuselens.compiler.options import CompilerOptions
from fuselens.compiler.runtime.triton_module import build_module

# the generator's own helpers, from modules of the prelude alone (Triton needs a source
# file): this GPU's, and the portable one the interpreter uses
_gpu, _portable = MathMode(interpret=False), MathMode(interpret=True)
_prelude = build_module([], _gpu.prelude(), CompilerOptions()).module
_prelude_tl = build_module([], _portable.prelude(), CompilerOptions()).module
_fl_sincos, _cody_waite, _poly = _prelude._fl_sincos, _prelude._fl_cody_waite, _prelude._fl_sincos_poly
_fl_sincos_tl, _fl_take_large = _prelude_tl._fl_sincos, _prelude._fl_take_large
# nvptx_math.ll, linked where mode 5 calls it
EXTERN = compile_options(interpret=False)

_TABLE = [(0xA2F9836E4E441529FC2757D1F534DDC0DB6295993C439041 >> (184 - 8 * j)) & 0xFFFFFFFF for j in range(24)]


def _picker_source(name: str, values: list[int]) -> str:
    lines = ["@triton.jit", f"def {name}(i, z):"]
    level = [f"(z + {v:#x})" for v in values]
    for bit in range(4):
        lines.append(f"    b{bit} = (i & {1 << bit}) != 0")
        nxt = []
        for j in range(0, len(level), 2):
            lines.append(f"    p{bit}_{j // 2} = tl.where(b{bit}, {level[j + 1]}, {level[j]})")
            nxt.append(f"p{bit}_{j // 2}")
        level = nxt
    lines.append(f"    return {level[0]}")
    return "\n".join(lines) + "\n"


# Triton needs the source of a jit function in a file: the select-tree pickers of mode 2
_PICKERS = "import triton\nimport triton.language as tl\n\n\n" + "\n\n".join(
    _picker_source(f"pick{k}", _TABLE[k:k + 16]) for k in (0, 4, 8))
_path = os.path.join(tempfile.mkdtemp(prefix="fl_sincos_"), "fl_sincos_pickers.py")
with open(_path, "w") as f:
    f.write(_PICKERS)
sys.path.insert(0, os.path.dirname(_path))
import fl_sincos_pickers as _pk  # noqa: E402

pick0, pick4, pick8 = _pk.pick0, _pk.pick4, _pk.pick8


@triton.jit
def reduce_large_table(a):
    xi = a.to(tl.uint32, bitcast=True)
    idx = (xi >> 26) & 15
    m = (((xi & 0xffffff) | 0x800000) << ((xi >> 23) & 7)).to(tl.uint64)
    z = m * 0
    res0 = (m * pick0(idx, z)) & 0xffffffff
    res1 = m * pick4(idx, z)
    res2 = m * pick8(idx, z)
    res0 = ((res2 >> 32) | (res0 << 32)) + res1
    n = (res0 + (z + 0x2000000000000000)) >> 62
    res0 = res0 - (n << 62)
    r = res0.to(tl.int64, bitcast=True).to(tl.float64) * 3.4061215800865545e-19
    return n.to(tl.int32), r.to(tl.float32)


@triton.jit
def sincos_variant(x, MODE: tl.constexpr):
    if MODE == 0:
        sn = tl.sin(x)
        cs = tl.cos(x)
    elif MODE == 1:
        if tl.max(tl.where(tl.abs(x) <= 8192.0, 0.0, 1.0)) > 0.0:
            sn = tl.sin(x)
            cs = tl.cos(x)
        else:
            q, r = _cody_waite(x)
            sn, cs = _poly(q, r)
    elif MODE == 2:
        q, r = _cody_waite(x)
        a = tl.abs(x)
        if tl.max(tl.where(a <= 8192.0, 0.0, 1.0)) > 0.0:
            qb, rb = reduce_large_table(a)
            q, r = _fl_take_large(x, a, q, r, qb, rb)
        sn, cs = _poly(q, r)
    elif MODE == 3:
        sn, cs = _fl_sincos_tl(x)
    elif MODE == 5:
        sn, cs = _fl_sincos(x)
    else:
        q, r = _cody_waite(x)
        sn, cs = _poly(q, r)
    return sn, cs


@triton.jit
def sq_kernel(X, O, MODE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sn, cs = sincos_variant(tl.load(X + i), MODE)
    tl.store(O + i, sn * sn + cs * cs)


@triton.jit
def both_kernel(X, S, C, MODE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    sn, cs = sincos_variant(tl.load(X + i), MODE)
    tl.store(S + i, sn)
    tl.store(C + i, cs)


def main() -> int:
    n = 64 * 2 ** 20
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    copy_ms = do_bench(lambda: out.copy_(x), warmup=50, rep=400)
    # the whole float range, both signs, for the error columns
    g = torch.Generator(device="cuda").manual_seed(0)
    wide = torch.exp(torch.rand(1 << 22, device="cuda", generator=g) * 88.7)
    wide = wide * (torch.randint(0, 2, wide.shape, device="cuda", generator=g) * 2 - 1)
    ref_s, ref_c = torch.sin(wide.double()), torch.cos(wide.double())
    s, c = torch.empty_like(wide), torch.empty_like(wide)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"same-size copy {copy_ms:.4f} ms")
    print("| mode | XBLOCK | warps | ms | registers | compile s | max error, whole range |")
    print("|---|---|---|---|---|---|---|")
    for mode in (0, 1, 2, 3, 4, 5):
        for block, warps in ((1024, 4), (1024, 8), (512, 4), (2048, 8)):
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fl_sincos_cache_")
            t = time.perf_counter()
            k = sq_kernel.warmup(torch.float32, torch.float32, MODE=mode, BLOCK=block, grid=(1,), num_warps=warps,
                                **EXTERN)
            compile_s = time.perf_counter() - t
            k._init_handles()
            ms = do_bench(lambda: sq_kernel[(n // block,)](x, out, MODE=mode, BLOCK=block, num_warps=warps, **EXTERN),
                          warmup=50, rep=400)
            both_kernel[(wide.numel() // block,)](wide, s, c, MODE=mode, BLOCK=block, num_warps=warps, **EXTERN)
            err = max(float((s.double() - ref_s).abs().max()), float((c.double() - ref_c).abs().max()))
            print(f"| {mode} | {block} | {warps} | {ms:.4f} | {k.n_regs} | {compile_s:.3f} | {err:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
