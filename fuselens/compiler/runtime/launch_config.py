"""Launch configuration of generated Triton kernels: block sizes and warps from the
kernel kind and sizes (`heuristic_config`), the small set autotuning measures
(`candidate_configs`) and the size classes its choices are cached under, and the
keywords a launch or compile passes to Triton (`LaunchConfig.compile_kwargs`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes (constexpr arguments) and warps of one launch."""

    xblock: int
    rblock: int = 1  # RBLOCK of reductions, YBLOCK of 2-D pointwise tiles
    num_warps: int = 4

    def constexprs(self, kind: str) -> dict:
        if kind in ("pointwise", "combo"):
            return {"XBLOCK": self.xblock}
        if kind == "pointwise2d":
            return {"XBLOCK": self.xblock, "YBLOCK": self.rblock}
        return {"XBLOCK": self.xblock, "RBLOCK": self.rblock}

    def compile_kwargs(self, kind: str) -> dict:
        """Everything Triton's launch or compile of this kernel takes besides its
        arguments: constexprs, warps, the target's options for the prelude."""
        return {**self.constexprs(kind), "num_warps": self.num_warps, **target_options()}

    def to_json(self) -> dict:
        return {"xblock": self.xblock, "rblock": self.rblock, "num_warps": self.num_warps}


def target_options() -> dict:
    """Compile options the generated prelude needs on this target (runtime/triton_prelude.py)."""
    from fuselens.compiler.runtime.triton_prelude import compile_options

    return compile_options(os.environ.get("TRITON_INTERPRET") == "1")


# Programs a looped column reduction aims for: two per SM of an H100/H200 (132 SMs).
COLUMN_PROGRAMS = 264


def heuristic_config(ks: Any, xnumel: int, rnumel: int) -> LaunchConfig:
    """Block sizes for a kernel at these sizes (no measurement). Targets ~8-16
    elements per thread on memory-bound kernels so each thread issues 16-byte
    vector accesses and the SMs keep enough bytes in flight."""
    from fuselens.compiler.codegen import triton as tg

    kind = ks.kernel_kind
    if kind in ("pointwise", "combo"):  # a combo kernel's parts are 1-D pointwise loops (xnumel: their sum)
        # 1024 fp32 (2048 bf16) elements per program: two 16-byte accesses per thread and buffer.
        # Half that where each element runs a long helper (sin/cos): LLVM and ptxas see a copy
        # of it per element a thread holds, and it runs as fast (H200, sin^2+cos^2 64M fp32:
        # 0.1306 ms at 512 x 4 warps, 0.1310 at 1024; compile 0.120 s against 0.165)
        long_math = getattr(ks, "long_math", False)
        xb = min((512 if long_math else 1024) * max(1, 4 // max(1, ks.elem_bytes)), _next_pow2(xnumel))
        xb = max(xb, 32)
        return LaunchConfig(xb, 1, max(1, min(4, xb // (128 if long_math else 256))))
    if kind == "pointwise2d":
        return LaunchConfig(min(32, _next_pow2(xnumel)), min(32, _next_pow2(rnumel)), 4)
    if kind == "persistent_reduction":
        rb = _next_pow2(max(rnumel, 1))
        if ks.column_reduction:
            xb = min(tg.MAX_XBLOCK_REDUCTION, max(1, 4096 // rb))
        elif rb >= 1024:
            xb = 1
        else:
            xb = min(tg.MAX_XBLOCK_REDUCTION, max(1, 1024 // rb))
        xb = min(xb, _next_pow2(xnumel))
        per_prog = xb * rb
        warps = max(1, min(16, per_prog // 512)) if rb >= 1024 else max(1, min(8, per_prog // 256))
        return LaunchConfig(xb, rb, _pow2_floor(warps))
    # looped reduction
    if ks.column_reduction:
        # one program per XBLOCK columns: a bias or norm-weight gradient ([tokens, 768] summed
        # over 4096 tokens) got 12 programs at 64 columns, 0.1 ms for a 12 MB read on the
        # H100's 132 SMs (BERT training: 12 of them a step). Narrower blocks until there are
        # about two programs an SM, rows widened to keep 4096 elements a tile (8 fp32 columns
        # are one 32-byte sector a row, still a whole memory transaction).
        if xnumel >= 2 * COLUMN_PROGRAMS * 32 and rnumel <= 1024 and not getattr(ks, "clamped_loads", False):
            # many short columns (the partial sums of a split reduction: ResNet's BatchNorms split
            # over the batch, 32768 x 784): a small tile of 4 warps, several programs an SM in
            # flight. H200, bf16 channels-last, 64x64 tiles of 8 warps against 32x32 of 4: backward
            # sums 71.5 -> 65.4 us (256 channels) and 44.6 -> 38.3 (512); statistics 28.9 -> 26.0
            # (results/column_configs_h200_*.txt); ResNet-50 training 7.00 -> 6.75 ms of kernels.
            # Not every kernel gains: BERT's 4096-row vocabulary bias sum went 64 -> 87 us (hence the
            # row limit), GPT-2's sum of a cat of q, k, v gradients 38 -> 60 us (a cat reads every
            # branch, clamped, at each element: it keeps the wide tile)
            return LaunchConfig(32, 32, 4)
        xb = min(64, _next_pow2(xnumel))
        while xb > 8 and -(-xnumel // xb) < COLUMN_PROGRAMS:
            xb //= 2
        return LaunchConfig(xb, min(tg.MAX_RBLOCK_LOOPED, max(64, 4096 // xb)), 8)
    rb = min(tg.MAX_RBLOCK_LOOPED, 2048 if ks.elem_bytes <= 4 else 1024)
    # 2048-wide chunks: 16 warps, one 16-byte access per thread and chunk (H200, 16384x4096 fp32
    # looped layernorm: 0.1326 ms with 8 warps, 0.1299 with 16; looped sums 0.1328 -> 0.1289)
    return LaunchConfig(1, rb, 16 if rb >= 2048 else 8)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def candidate_configs(ks: Any, xnumel: int, rnumel: int) -> list[LaunchConfig]:
    """The small set autotuning measures (the heuristic's choice first)."""
    from fuselens.compiler.codegen import triton as tg

    kind = ks.kernel_kind
    out = [heuristic_config(ks, xnumel, rnumel)]
    if kind in ("pointwise", "combo"):
        for xb, w in ((512, 4), (1024, 4), (2048, 4), (2048, 8), (4096, 8)):
            if xb <= max(32, _next_pow2(xnumel)):
                out.append(LaunchConfig(xb, 1, w))
    elif kind == "pointwise2d":
        for xb, yb, w in ((32, 32, 4), (64, 64, 8), (64, 32, 4), (32, 64, 4), (16, 64, 4)):
            out.append(LaunchConfig(min(xb, _next_pow2(xnumel)), min(yb, _next_pow2(rnumel)), w))
    elif kind == "persistent_reduction":
        rb = _next_pow2(max(rnumel, 1))
        for xb in (1, 2, 4, 8, 16, 32, 64):
            if xb > _next_pow2(xnumel) or xb * rb > 16384:
                continue
            for w in (4, 8, 16):
                if xb * rb >= w * 32 * 4:  # at least 4 elements (one 16-byte access) per thread
                    out.append(LaunchConfig(xb, rb, w))
    elif ks.column_reduction:
        for xb, rb, w in ((64, 64, 8), (32, 32, 4), (32, 16, 4), (64, 16, 4), (64, 32, 4), (64, 8, 4),
                          (128, 16, 8), (16, 64, 4)):
            if xb <= max(1, _next_pow2(xnumel)):
                out.append(LaunchConfig(xb, rb, w))
    else:
        for xb, rb, w in ((1, 2048, 8), (1, 1024, 4), (1, 2048, 16), (2, 1024, 8), (4, 512, 8),
                          (64, 64, 8), (32, 128, 8), (16, 256, 8)):
            if rb <= tg.MAX_RBLOCK_LOOPED and xb <= max(1, _next_pow2(xnumel)):
                out.append(LaunchConfig(xb, rb, w))
    seen: list[LaunchConfig] = []
    for c in out:
        if c not in seen:
            seen.append(c)
    return seen[:8]  # each candidate is one more compile: keep the set small


def size_class(xnumel: int, rnumel: int) -> str:
    """Autotune results are shared by sizes in the same power-of-two buckets."""
    return f"{_next_pow2(xnumel)}x{_next_pow2(rnumel)}"
