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
