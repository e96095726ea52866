"""Point Triton's, Inductor's and fuselens' caches at a fresh directory, so cold
compile times are cold. Call before torch is imported: Inductor reads these
variables once, at import."""

from __future__ import annotations

import os
import tempfile


def use_fresh_compile_caches(prefix: str) -> str:
    """Set the cache variables to subfolders of a new temp dir; returns that dir."""
    root = tempfile.mkdtemp(prefix=prefix)
    for var, sub in (("TRITON_CACHE_DIR", "triton"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("FUSELENS_CACHE_DIR", "fuselens")):
        os.environ[var] = os.path.join(root, sub)
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    return root
