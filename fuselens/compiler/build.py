"""Compile one graph's kernels into ONE shared library, cached on disk.

    g++ -O3 -march=native -fopenmp -shared -fPIC -fno-math-errno

The cache key is a hash of the source and the command line; the library lives
in `<cache_dir>/<hash[:2]>/<hash>.so` (cache_dir: option `cache_dir`, else
$FUSELENS_CACHE_DIR, else ~/.cache/fuselens) and is written atomically (rename)
so concurrent processes never load a half-written file. A compile error raises
`KernelCompileError` naming the kernel whose lines g++ complained about.

Vectorization (checked with `-fopt-info-vec-optimized`, g++ 12.2, this Xeon with
AVX-512): the inner `#pragma omp simd` loops of pointwise kernels, sum/max
reductions (with `reduction(...)` clauses) and loops calling the fl_exp/fl_log/
fl_sin/fl_cos/fl_tanh/fl_erf helpers are reported "loop vectorized using 64 byte
vectors" with -mprefer-vector-width=512 (32 byte by default). Loops calling
<cmath> functions (expm1, pow, atan2...) stay scalar.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Optional, Sequence

_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class KernelCompileError(RuntimeError):
    """g++ rejected a generated kernel."""

    def __init__(self, kernel: str, message: str) -> None:
        super().__init__(f"fuselens: C++ compile error in kernel {kernel}: {message}")
        self.kernel = kernel
        self.detail = message


@dataclass
class BuildResult:
    lib: ctypes.CDLL
    path: str
    cache_hit: bool
    seconds: float


def cflags(options: Any) -> list[str]:
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-std=c++17", "-w"]
    if options.vector_width:
        flags.append(f"-mprefer-vector-width={max(128, min(512, options.vector_width * 32))}")
    else:
        flags.append("-mprefer-vector-width=512")
    return flags + list(options.extra_cflags)


def library_path(source: str, options: Any) -> str:
    cmd = [options.cxx, *cflags(options)]
    key = hashlib.sha256((" ".join(cmd) + "\n" + source).encode()).hexdigest()
    root = options.resolved_cache_dir()
    return os.path.join(root, key[:2], f"{key}.so")


def build(source: str, options: Any, kernel_spans: Sequence[tuple[str, int, int]] = ()) -> BuildResult:
    """Compile (or fetch from the cache) and load `source`.

    `kernel_spans` are (kernel name, first line, last line) so an error can name
    the kernel it happened in."""
    import time

    t0 = time.perf_counter()
    path = library_path(source, options)
    with _lock:
        if path in _loaded:
            return BuildResult(_loaded[path], path, True, time.perf_counter() - t0)
    hit = os.path.exists(path)
    if not hit:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, src_path = tempfile.mkstemp(suffix=".cpp", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            f.write(source)
        tmp_out = src_path[:-4] + ".so"
        cmd = [options.cxx, *cflags(options), src_path, "-o", tmp_out]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise KernelCompileError(_blame(proc.stderr, src_path, kernel_spans), _first_error(proc.stderr))
            os.replace(tmp_out, path)
        finally:
            for p in (src_path, tmp_out):
                if os.path.exists(p):
                    os.unlink(p)
    lib = ctypes.CDLL(path)
    with _lock:
        _loaded[path] = lib
    return BuildResult(lib, path, hit, time.perf_counter() - t0)


def _first_error(stderr: str) -> str:
    for line in stderr.splitlines():
        if "error" in line:
            return line.split("error:", 1)[-1].strip()
    return stderr.strip().splitlines()[-1] if stderr.strip() else "unknown error"


def _blame(stderr: str, src_path: str, spans: Sequence[tuple[str, int, int]]) -> str:
    for m in re.finditer(re.escape(os.path.basename(src_path)) + r":(\d+):\d+: error", stderr):
        line = int(m.group(1))
        for name, lo, hi in spans:
            if lo <= line <= hi:
                return name
    return spans[0][0] if spans else "<library>"
