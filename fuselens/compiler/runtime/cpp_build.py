"""Compile one graph's kernels into ONE shared library, cached on disk.

    g++ -O3 -march=native -fopenmp -shared -fPIC -fno-math-errno -fno-trapping-math -funroll-loops ...

The cache key is a hash of the source and the command line; the library lives
in `<cache_dir>/<hash[:2]>/<hash>.so` (cache_dir: option `cache_dir`, else
$FUSELENS_CACHE_DIR, else $XDG_CACHE_HOME/fuselens or ~/.cache/fuselens; created 0700,
and refused when another account owns it: private_dirs.py) and is written atomically (rename)
so concurrent processes never load a half-written file. A compile error raises
`KernelCompileError` naming the kernel whose lines g++ complained about.

Vectorization (checked with `-fopt-info-vec-optimized`, g++ 12.2, this Xeon with
AVX-512): the inner `#pragma omp simd` loops of pointwise kernels, sum/max
reductions (with `reduction(...)` clauses) and loops calling the fl_exp/fl_log/
fl_sin/fl_cos/fl_tanh/fl_erf helpers are reported "loop vectorized using 64 byte
vectors" with -mprefer-vector-width=512 (32 byte by default). Loops calling
<cmath> functions (expm1, pow, atan2...) stay scalar.

Precompiled prelude: half of a small library's g++ time is parsing the prelude's
standard headers. The first build in a process starts a background g++ that
precompiles the prelude (`fl_prelude.h.gch`, ~4 s, once per compiler + flags) into
$FUSELENS_PCH_DIR or <cache root>/pch/<key> (independent of `cache_dir`: it
holds no generated code); builds after that include it instead of the text
(g++ falls back to the header text by itself if the .gch does not match).
Measured on this 2-core machine under load: 1.0 s -> 0.45 s for a one-kernel library.
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

from fuselens.compiler.runtime.atomic_file import write_atomically
from fuselens.private_dirs import cache_root, check_private_file, private_dir

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


# -funroll-loops with -fvariable-expansion-in-unroller: an unrolled `omp simd` reduction
# gets several vector accumulators instead of one dependency chain (the reduction's
# reassociation is what `omp simd reduction` already allows). Layernorm 4k x 1k kernel,
# one process, interleaved: 0.741 -> 0.692 ms (ATen's 0.769); other cases 1-2% faster,
# compile time unchanged (benchmarks/RESULTS.md, CPU, second session).
_UNROLL = ["-funroll-loops", "-fvariable-expansion-in-unroller"]


def cflags(options: Any) -> list[str]:
    # -fno-trapping-math: without it g++ 12 keeps the prelude's float selects (`x != x ? x : r`)
    # as branches, "control flow in loop", and loops calling fl_exp/fl_tanh stay scalar (exp of
    # 256x1024 floats: 0.90 -> 0.2 ms). Results are unchanged: nothing reads FP exception flags.
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math",
             "-std=c++17", "-w", *_UNROLL]
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


_pch_state: dict[str, str] = {}  # key -> "building" | "ready" | "failed"


def _pch_dir(options: Any) -> Optional[str]:
    """The directory holding the precompiled prelude when it is ready; otherwise
    start building it in the background (once) and return None."""
    from fuselens.compiler.codegen.cpp_prelude import PRELUDE

    flags = [f for f in cflags(options) if f != "-shared"]
    key = hashlib.sha256((" ".join([options.cxx, *flags]) + "\n" + PRELUDE).encode()).hexdigest()[:24]
    root = os.environ.get("FUSELENS_PCH_DIR") or os.path.join(cache_root(), "pch")
    d = private_dir(os.path.join(root, key))  # g++ includes from here: ours alone
    gch = os.path.join(d, "fl_prelude.h.gch")
    with _lock:
        state = _pch_state.get(key)
        if state is None and os.path.exists(gch) and _private(gch) and _private(os.path.join(d, "fl_prelude.h")):
            state = _pch_state[key] = "ready"
        if state == "ready":
            return d
        if state is not None:
            return None
        _pch_state[key] = "building"

    def work() -> None:
        ok = False
        try:
            header = os.path.join(d, "fl_prelude.h")
            write_atomically(header, "#pragma once\n" + PRELUDE)
            tmp_gch = gch + f".{os.getpid()}.tmp"
            proc = subprocess.run([options.cxx, *flags, "-x", "c++-header", header, "-o", tmp_gch],
                                  capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp_gch, gch)
                ok = True
            elif os.path.exists(tmp_gch):
                os.unlink(tmp_gch)
        except OSError:
            pass
        with _lock:
            _pch_state[key] = "ready" if ok else "failed"

    threading.Thread(target=work, name="fuselens-pch", daemon=True).start()
    return None


def _private(path: str) -> bool:
    try:
        check_private_file(path)
        return True
    except OSError:
        return False


def _with_pch(source: str, options: Any) -> tuple[str, list[str]]:
    """The source to hand g++ (prelude replaced by the precompiled header, line
    numbers kept with #line) and the extra flags it needs."""
    from fuselens.compiler.codegen.cpp_prelude import PRELUDE

    if not source.startswith(PRELUDE):
        return source, []
    d = _pch_dir(options)
    if d is None:
        return source, []
    rest = source[len(PRELUDE):]
    return f'#include "fl_prelude.h"\n#line {PRELUDE.count(chr(10)) + 1}\n' + rest, ["-I", d]


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
        private_dir(os.path.dirname(path))
        text, extra = _with_pch(source, options)
        fd, src_path = tempfile.mkstemp(suffix=".cpp", dir=os.path.dirname(path))
        with os.fdopen(fd, "w") as f:
            f.write(text)
        tmp_out = src_path[:-4] + ".so"
        cmd = [options.cxx, *cflags(options), *extra, src_path, "-o", tmp_out]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise KernelCompileError(_blame(proc.stderr, src_path, kernel_spans), _first_error(proc.stderr))
            os.replace(tmp_out, path)
        finally:
            for p in (src_path, tmp_out):
                if os.path.exists(p):
                    os.unlink(p)
    lib = ctypes.CDLL(check_private_file(path))  # a library is code: ours alone, or refused
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
