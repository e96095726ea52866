"""Hand-written Triton kernel shapes for layernorm 16384x4096 fp32 on the GPU,
against Inductor and a same-size copy (one process, `do_bench`):

    python -m benchmarks.gpu_layernorm_shapes

Persistent rows (1 or 2 rows a program, 4-32 warps), looped Welford (R-block
1024/2048, 4-16 warps, with and without L2 eviction hints), looped shifted
sum/sum-of-squares, and a grid-stride persistent kernel. The measurement behind
the Triton generator's looped Welford kernel (benchmarks/RESULTS.md, GPU)."""
import time, sys
import torch, triton, triton.language as tl
import torch.nn.functional as F
from triton.testing import do_bench

@triton.jit
def persistent(X, W, B, O, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    xi = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    r = tl.arange(0, RBLOCK)[None, :]
    v = tl.load(X + RBLOCK * xi + r)
    wv = tl.load(W + r); bv = tl.load(B + r)
    mean = tl.sum(v, 1)[:, None] / RBLOCK
    d = v - mean
    var = tl.sum(d * d, 1)[:, None] / RBLOCK
    tl.store(O + RBLOCK * xi + r, d * tl.rsqrt(var + 1e-5) * wv + bv)

@triton.jit
def _wcomb(m1, s1, n1, m2, s2, n2):
    n = n1 + n2
    d = m2 - m1
    f = tl.where(n == 0, 0.0, n2 / n)
    return m1 + d * f, s1 + s2 + d * d * n1 * f, n

@triton.jit
def looped_welford(X, W, B, O, N: tl.constexpr, RBLOCK: tl.constexpr, EVICT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, RBLOCK)
    mean = tl.zeros([RBLOCK], tl.float32); m2 = tl.zeros([RBLOCK], tl.float32)
    for i in range(0, N // RBLOCK):
        if EVICT:
            v = tl.load(X + row * N + i * RBLOCK + r, eviction_policy="evict_last")
        else:
            v = tl.load(X + row * N + i * RBLOCK + r)
        d = v - mean
        mean = mean + d / (i + 1)
        m2 = m2 + d * (v - mean)
    cnt = tl.full([RBLOCK], N // RBLOCK, tl.float32)
    mu, s, _ = tl.reduce((mean, m2, cnt), 0, _wcomb)
    rstd = tl.rsqrt(s / N + 1e-5)
    for i in range(0, N // RBLOCK):
        if EVICT:
            v = tl.load(X + row * N + i * RBLOCK + r, eviction_policy="evict_first")
        else:
            v = tl.load(X + row * N + i * RBLOCK + r)
        wv = tl.load(W + i * RBLOCK + r, eviction_policy="evict_last"); bv = tl.load(B + i * RBLOCK + r, eviction_policy="evict_last")
        tl.store(O + row * N + i * RBLOCK + r, (v - mu) * rstd * wv + bv)

@triton.jit
def looped_sums(X, W, B, O, N: tl.constexpr, RBLOCK: tl.constexpr):
    # one-pass sum/sumsq (shifted by the first element to limit cancellation)
    row = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, RBLOCK)
    shift = tl.load(X + row * N)
    s1 = tl.zeros([RBLOCK], tl.float32); s2 = tl.zeros([RBLOCK], tl.float32)
    for i in range(0, N // RBLOCK):
        v = tl.load(X + row * N + i * RBLOCK + r, eviction_policy="evict_last") - shift
        s1 += v; s2 += v * v
    t1 = tl.sum(s1, 0) / N; t2 = tl.sum(s2, 0) / N
    mu = t1 + shift
    rstd = tl.rsqrt(t2 - t1 * t1 + 1e-5)
    for i in range(0, N // RBLOCK):
        v = tl.load(X + row * N + i * RBLOCK + r, eviction_policy="evict_first")
        wv = tl.load(W + i * RBLOCK + r, eviction_policy="evict_last"); bv = tl.load(B + i * RBLOCK + r, eviction_policy="evict_last")
        tl.store(O + row * N + i * RBLOCK + r, (v - mu) * rstd * wv + bv)

@triton.jit
def gridstride(X, W, B, O, M, N: tl.constexpr, NPROG: tl.constexpr):
    r = tl.arange(0, N)
    wv = tl.load(W + r); bv = tl.load(B + r)
    pid = tl.program_id(0)
    for row in tl.range(pid, M, NPROG, num_stages=2):
        v = tl.load(X + row.to(tl.int64) * N + r)
        mean = tl.sum(v, 0) / N
        d = v - mean
        var = tl.sum(d * d, 0) / N
        tl.store(O + row.to(tl.int64) * N + r, d * tl.rsqrt(var + 1e-5) * wv + bv)


def main() -> None:
    M, N = 16384, 4096
    x = torch.randn(M, N, device="cuda"); w = torch.randn(N, device="cuda"); b = torch.randn(N, device="cuda")
    ref = F.layer_norm(x, (N,), w, b)
    def bench(name, fn):
        out = torch.empty_like(x)
        try:
            fn(out); torch.cuda.synchronize()
            err = (out - ref).abs().max().item()
            ms = do_bench(lambda: fn(out), warmup=50, rep=300)
            print(f"{name:40s} {ms:.4f} ms  err {err:.1e}", flush=True)
        except Exception as e:
            print(f"{name:40s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)

    nbytes = 2 * x.numel() * 4
    y = torch.empty_like(x)
    cms = do_bench(lambda: y.copy_(x), warmup=50, rep=300)
    print(f"copy same size {cms:.4f} ms = {nbytes/cms/1e9:.2f} TB/s")
    print(f"eager {do_bench(lambda: F.layer_norm(x,(N,),w,b)):.4f} ms")
    fi = torch.compile(lambda x, w, b: F.layer_norm(x, (N,), w, b))
    fi(x, w, b)
    print(f"inductor {do_bench(lambda: fi(x, w, b), warmup=50, rep=300):.4f} ms")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for xb in (1, 2):
        for nw in (4, 8, 16, 32):
            bench(f"persistent XBLOCK={xb} warps={nw}", lambda o, xb=xb, nw=nw: persistent[(M // xb,)](x, w, b, o, XBLOCK=xb, RBLOCK=N, num_warps=nw))
    for rb in (1024, 2048):
        for nw in (4, 8, 16):
            for ev in (True, False):
                bench(f"welford R={rb} warps={nw} evict={ev}", lambda o, rb=rb, nw=nw, ev=ev: looped_welford[(M,)](x, w, b, o, N=N, RBLOCK=rb, EVICT=ev, num_warps=nw))
        for nw in (8, 16):
            bench(f"sums R={rb} warps={nw}", lambda o, rb=rb, nw=nw: looped_sums[(M,)](x, w, b, o, N=N, RBLOCK=rb, num_warps=nw))
    for k in (2, 4, 8):
        for nw in (8, 16):
            bench(f"gridstride {k}x{sms} warps={nw}", lambda o, k=k, nw=nw: gridstride[(k * sms,)](x, w, b, o, M, N=N, NPROG=k * sms, num_warps=nw))



if __name__ == "__main__":
    main()
