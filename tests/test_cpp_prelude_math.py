"""The generated C++ kernels' own float32 exp (cpp_prelude.fl_exp), compiled
with the real g++ and compared with glibc's double exp over a sweep of every
97th float bit pattern: accuracy, overflow to inf, the flush to zero below
~1.8e-38, NaN."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fuselens.compiler.codegen.cpp_prelude import PRELUDE

HARNESS = r"""
#include <cstdio>
// Kernels call fl_exp from vectorized loops: sweep through one, as they do.
static void exp_block(const float* __restrict__ x, float* __restrict__ y, int n) {
  #pragma omp simd
  for (int j = 0; j < n; j++) y[j] = fl_exp(x[j]);
}
int main() {
  double maxrel = 0, maxabs_sub = 0; long bad = 0;
  static float xs[4096], ys[4096];
  for (uint64_t b0 = 0; b0 < 0xFFFFFFFFull; b0 += 97ull * 4096) {
    int m = 0;
    for (uint64_t b = b0; b < b0 + 97ull * 4096 && b < 0xFFFFFFFFull; b += 97) xs[m++] = fl_i2f((int32_t)(uint32_t)b);
    exp_block(xs, ys, m);
    for (int j = 0; j < m; j++) {
      float x = xs[j], got = ys[j];
      if (x != x) { bad += got == got; continue; }
      double ref = std::exp((double)x);
      if (ref > (double)FLT_MAX) { bad += !std::isinf(got); continue; }
      if (x < -86.98f) { maxabs_sub = std::fmax(maxabs_sub, std::fabs(got - ref)); continue; }
      maxrel = std::fmax(maxrel, std::fabs(got - ref) / ref);
    }
  }
  const float edge[] = {88.72283172607422f, 88.72283935546875f, -86.97f, 0.0f, -0.0f, 1.0f};
  for (float v : edge) {
    double ref = std::exp((double)v);
    float got = fl_exp(v);
    if (ref > (double)FLT_MAX ? !std::isinf(got) : std::fabs(got - (float)ref) > 2.4e-7 * ref) bad++;
  }
  bad += fl_exp(-INFINITY) != 0.0f || fl_exp(-104.0f) != 0.0f || !std::isinf(fl_exp(INFINITY));
  printf("%.3g %.3g %ld\n", maxrel, maxabs_sub, bad);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_fl_exp_is_within_two_ulp_overflows_to_inf_and_flushes_below_2e_38(tmp_path):
    src = tmp_path / "exp_sweep.cpp"
    src.write_text(PRELUDE + HARNESS)
    exe = tmp_path / "exp_sweep"
    subprocess.run(["g++", "-O3", "-march=native", "-fopenmp-simd", "-mprefer-vector-width=512", "-fno-math-errno",
                    "-std=c++17", "-w", str(src), "-o", str(exe)],
                   check=True, capture_output=True)
    maxrel, maxabs_sub, bad = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert int(bad) == 0  # NaN stays NaN, overflow is inf, edge values exact to rounding
    assert float(maxrel) < 2.4e-7  # two float32 ulps relative
    assert float(maxabs_sub) < 1.8e-38  # below exp(-86.98) results flush to zero


BF16_HARNESS = r"""
#include <cstdio>
static void to_bf16_block(const float* __restrict__ x, uint16_t* __restrict__ y, int n) {
  #pragma omp simd
  for (int j = 0; j < n; j++) y[j] = fl_to_bf16(x[j]);
}
int main(int argc, char** argv) {
  // argv[1]: a file of (float bits, expected bfloat16 bits) pairs from torch
  FILE* f = std::fopen(argv[1], "rb");
  static uint32_t pairs[2 * 65536];
  size_t n = std::fread(pairs, 8, 65536, f) ;
  static float xs[65536]; static uint16_t ys[65536];
  for (size_t i = 0; i < n; i++) xs[i] = fl_i2f((int32_t)pairs[2 * i]);
  to_bf16_block(xs, ys, (int)n);
  long bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint16_t want = (uint16_t)pairs[2 * i + 1];
    bool nan = (want & 0x7F80) == 0x7F80 && (want & 0x7F);
    if (nan ? !(((ys[i] & 0x7F80) == 0x7F80) && (ys[i] & 0x7F)) : ys[i] != want) bad++;
    if (fl_from_bf16(want) != fl_from_bf16(want) ? false : fl_round_bf16(xs[i]) != fl_from_bf16(want)) bad++;
  }
  for (uint32_t h = 0; h < 65536; h++) {  // every bfloat16 widens exactly and converts back to itself
    float v = fl_from_bf16((uint16_t)h);
    if (v == v && fl_to_bf16(v) != h) bad++;
  }
  printf("%zu %ld\n", n, bad);
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_bfloat16_conversions_match_torch_bit_for_bit_in_a_vectorized_loop(tmp_path):
    import torch

    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (60000,), generator=g, dtype=torch.int64).to(torch.int32)
    edge = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.4028234e38, -3.4028234e38,
                         1e-45, 1.17549435e-38, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, 65504.0])
    x = torch.cat([bits.view(torch.float32), edge])
    want = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    pairs = torch.stack([x.view(torch.int32), want], 1).contiguous()
    data = tmp_path / "pairs.bin"
    data.write_bytes(pairs.numpy().tobytes())
    src = tmp_path / "bf16.cpp"
    src.write_text(PRELUDE + BF16_HARNESS)
    exe = tmp_path / "bf16"
    subprocess.run(["g++", "-O3", "-march=native", "-fopenmp-simd", "-mprefer-vector-width=512", "-fno-math-errno",
                    "-std=c++17", "-w", str(src), "-o", str(exe)], check=True, capture_output=True)
    n, bad = subprocess.run([str(exe), str(data)], check=True, capture_output=True, text=True).stdout.split()
    assert int(n) == len(x) and int(bad) == 0
