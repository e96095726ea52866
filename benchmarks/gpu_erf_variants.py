"""erf and GELU variants inside gelu(x+b) bf16 16384x4096 on the GPU (one process,
`do_bench`): libdevice's erf (`tl.erf`, mode 0), Abramowitz & Stegun 7.1.28 (mode 1,
measured and rejected), the Triton generator's `_fl_erf_16bit`, A&S 7.1.26 with the
prelude's approximate rcp and ex2 (mode 2), its `_fl_gelu_16bit`, x Phi(x) from the
same formula, which the generator prints for GELU's decomposition (mode 3), and x + b
alone (mode 4: the memory floor). Each at several block shapes, with each variant's
erf error against float64 and how often its bfloat16 result differs from the
correctly rounded float64 GELU:

    python -m benchmarks.gpu_erf_variants
"""
import torch, triton, triton.language as tl
from triton.testing import do_bench
import torch.nn.functional as F

from fuselens.compiler.codegen.triton import library_source
from fuselens.compiler.options import CompilerOptions
from fuselens.compiler.runtime.triton_module import build_module

# the generator's helper itself, from a module of the prelude alone (Triton needs a source file)
_prelude = build_module([], library_source([]), CompilerOptions()).module
_fl_erf_16bit, _fl_gelu_16bit = _prelude._fl_erf_16bit, _prelude._fl_gelu_16bit


@triton.jit
def erf_as28(x):
    a = tl.abs(x)
    p = 0.0000430638 * a + 0.0002765672
    p = p * a + 0.0001520143
    p = p * a + 0.0092705272
    p = p * a + 0.0422820123
    p = p * a + 0.0705230784
    p = p * a + 1.0
    p = p * p; p = p * p; p = p * p; p = p * p
    r = 1.0 - 1.0 / p
    return tl.where(x < 0, -r, r)


@triton.jit
def erf_variant(x, MODE: tl.constexpr):
    if MODE == 0:
        e = tl.erf(x)
    elif MODE == 1:
        e = erf_as28(x)
    else:
        e = _fl_erf_16bit(x)
    return e


@triton.jit
def gelu_k(X, B, O, N: tl.constexpr, MODE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i).to(tl.float32) + tl.load(B + i % N).to(tl.float32)
    if MODE == 3:
        g = _fl_gelu_16bit(x)
    elif MODE == 4:
        g = x
    else:
        g = 0.5 * x * (1.0 + erf_variant(x * 0.7071067811865476, MODE))
    tl.store(O + i, g.to(tl.bfloat16))


@triton.jit
def erf_only(X, O, MODE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(O + i, erf_variant(tl.load(X + i), MODE))


def main() -> None:
    M, N = 16384, 4096
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16); b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    ref = F.gelu((x.float() + b.float()).double()).to(torch.bfloat16)  # these kernels add in float32, as both compilers do
    y = torch.empty_like(x)
    print("copy", do_bench(lambda: y.copy_(x), warmup=50, rep=300))
    fi = torch.compile(lambda x, b: F.gelu(x + b)); fi(x, b)
    print("inductor", do_bench(lambda: fi(x, b), warmup=50, rep=300))
    g = torch.linspace(-12, 12, 2**22, device="cuda", dtype=torch.float32)
    gd = torch.erf(g.double())
    for mode in (0, 1, 2, 3, 4):
        o = torch.empty_like(x)
        for bl, nw in ((1024, 4), (2048, 4), (2048, 8), (4096, 4)):
            gelu_k[(M * N // bl,)](x, b, o, N=N, MODE=mode, BLOCK=bl, num_warps=nw)
            ms = do_bench(lambda: gelu_k[(M * N // bl,)](x, b, o, N=N, MODE=mode, BLOCK=bl, num_warps=nw), warmup=50, rep=300)
            mism = (o != ref).float().mean().item()
            print(f"mode {mode} block {bl} warps {nw}: {ms:.4f} ms, differs from the rounded exact GELU in "
                  f"{mism:.2e} of the outputs, max diff {(o.float() - ref.float()).abs().max().item():.2e}")
        if mode < 3:
            e = torch.empty_like(g)
            erf_only[(g.numel() // 1024,)](g, e, MODE=mode, BLOCK=1024)
            print(f"  erf abs err vs fp64 {(e.double() - gd).abs().max().item():.2e}")



if __name__ == "__main__":
    main()
