"""Launch compiled Triton kernels through torch's precompiled CUDA launcher.

Triton launches a kernel through a small C extension it generates per kernel
signature and builds with gcc at the first launch (`CompiledKernel.run`): on the
H200, 0.09-0.2 s a signature with a cold Triton cache, the largest share of a
layernorm graph's 0.43 s cold compile after Triton's own compile (profile in
benchmarks/RESULTS.md). torch ships one launcher for every signature,
`torch._C._StaticCudaLauncher` (what Inductor uses): it loads the cubin with the
driver API and packs the arguments by a type string. `StaticKernel.make`
returns one for a compiled kernel when everything it relies on holds (CUDA, not
ROCm, a cubin, one CTA per program, no scratch memory, no cooperative or PDL
launch, argument types it knows), else None: the caller stays on Triton's
launcher, which is always correct.

The private API differs across torch versions: `_load_kernel` returns
(function, n_regs, n_spills) in 2.11 and (module, function, n_regs, n_spills)
in 2.13; both take (cubin path, kernel name, shared bytes, device) and
`_launch_kernel(function, gx, gy, gz, num_warps, shared, arg types, args,
stream)`.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Optional, Sequence

import torch

from fuselens.compiler.runtime.atomic_file import write_atomically

# Triton signature type -> the launcher's one-character code (torch's own table)
_TYPES = {
    "i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l",
    "u1": "I", "u8": "B", "u16": "H", "u32": "I", "u64": "K",
    "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d",
}


def launcher_api() -> Any:
    """torch's static CUDA launcher, or None where there is none to use."""
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("FUSELENS_STATIC_LAUNCH", "1") == "0":
        return None
    if getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return None
    return getattr(torch._C, "_StaticCudaLauncher", None)


def _constexpr_positions(kernel: Any, names: Sequence[str]) -> set[int]:
    """Positions of the arguments compiled into the binary (declared constexprs and
    values Triton specialized, such as an int equal to 1): not passed at launch."""
    src = kernel.src
    sig = dict(src.signature)
    out = set()
    for i, nm in enumerate(names):
        ty = sig.get(nm, sig.get(i))
        if ty == "constexpr":
            out.add(i)
    for key in dict(getattr(src, "constants", {}) or {}):
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        if isinstance(key, str) and key in names:
            out.add(names.index(key))
        elif isinstance(key, int):
            out.add(key)
    return out


class StaticKernel:
    """One compiled kernel loaded on one device, launched with torch's launcher."""

    def __init__(self, api: Any, function: int, num_warps: int, shared: int, keep: list[int], types: str,
                 scratch: int, handles: tuple) -> None:
        self.api = api
        self.function = function
        self.num_warps = num_warps
        self.shared = shared
        self.keep = keep  # positions of the launch arguments among the kernel's parameters
        self.types = types
        self.scratch = scratch  # trailing scratch pointers the binary takes (passed as null)
        self._handles = handles  # what _load_kernel returned: keeps the module alive

    @classmethod
    def make(cls, kernel: Any, names: Sequence[str], values: Sequence[Any], device: int,
             cubin_dir: str) -> Optional["StaticKernel"]:
        """The static launch of `kernel` (a Triton CompiledKernel) for a call with
        these parameter values, or None when some precondition does not hold."""
        api = launcher_api()
        if api is None or kernel is None:
            return None
        try:
            md = kernel.metadata
            cubin = kernel.asm["cubin"]
            if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False) \
                    or getattr(md, "launch_pdl", False):
                return None
            if any(c not in (1, None) for c in (tuple(getattr(md, "cluster_dims", None) or ()))):
                return None
            scratch = 0
            for field in ("global_scratch_size", "profile_scratch_size"):
                if hasattr(md, field):
                    if getattr(md, field):
                        return None
                    scratch += 1
            const = _constexpr_positions(kernel, names)
            sig = dict(kernel.src.signature)
            keep, types = [], []
            for i, nm in enumerate(names):
                if i in const:
                    continue
                ty = sig.get(nm, sig.get(i))
                if not isinstance(ty, str):
                    return None
                code = "O" if ty.startswith("*") else _TYPES.get(ty)
                if code is None or i >= len(values):
                    return None
                keep.append(i)
                types.append(code)
            path = _write_cubin(cubin_dir, cubin)
            handles = tuple(api._load_kernel(path, md.name, int(md.shared), int(device)))
            function = handles[1] if len(handles) == 4 else handles[0]
            return cls(api, int(function), int(md.num_warps), int(md.shared), keep, "".join(types) + "O" * scratch,
                       scratch, handles)
        except Exception:  # noqa: BLE001 - any surprise in a private API: Triton's own launcher instead
            return None

    def launch(self, grid: Sequence[int], stream: int, values: Sequence[Any]) -> None:
        g = tuple(grid) + (1, 1)
        args = tuple(values[i] for i in self.keep) + (None,) * self.scratch
        self.api._launch_kernel(self.function, g[0], g[1], g[2], self.num_warps, self.shared, self.types, args, stream)

    def bound(self, grid: Sequence[int], nptr_size: int, fixed: Sequence[Any]) -> Callable:
        """`go(stream, *leading)`: this launch with the grid bound and every
        parameter from position `nptr_size` on bound to `fixed` (the wrapper's fast
        path passes data pointers and size symbols; numels and constexprs are
        constants of its cache key)."""
        g = tuple(grid) + (1, 1)
        lead = [f"a{i}" for i in range(nptr_size)]
        parts = []
        for i in self.keep:
            parts.append(lead[i] if i < nptr_size else repr(fixed[i - nptr_size]))
        parts += ["None"] * self.scratch
        tup = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        src = (f"def go(stream{''.join(', ' + a for a in lead)}):\n"
               f"    L(F, {g[0]}, {g[1]}, {g[2]}, {self.num_warps}, {self.shared}, {self.types!r}, {tup}, stream)\n")
        ns: dict[str, Any] = {"L": self.api._launch_kernel, "F": self.function}
        exec(src, ns)  # noqa: S102 - our own argument list
        return ns["go"]


def _write_cubin(root: str, cubin: bytes) -> str:
    """The cubin as a file (what the launcher loads), written once, atomically."""
    d = os.path.join(root, "cubin")
    path = os.path.join(d, hashlib.sha256(cubin).hexdigest()[:40] + ".cubin")
    if not os.path.exists(path):
        write_atomically(path, cubin)
    return path
