"""Loading a graph's Triton module.

`build_module` writes a graph's Triton source (codegen/triton.py) to
`<cache_dir>/triton/<sha256>.py` (Triton's JIT needs a real file to read the
source back), imports it and gives each kernel a `Launcher` (triton_launcher.py);
the helper prelude is a module of its own beside it (runtime/triton_prelude.py),
built once a process and shared by every graph. `finalize` attaches the device,
kernel timing, the generated wrapper and the optional CUDA graph to a compiled
graph's runner.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import os
import sys
import threading
from typing import Any, Optional, Sequence

from fuselens.compiler.runtime.atomic_file import write_atomically
from fuselens.compiler.layout_passes import forward_user_outputs
from fuselens.compiler.runtime.capture_inputs import gradient_output_indices, static_input_indices
from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner, graph_stage
from fuselens.compiler.runtime.triton_launcher import Launcher
from fuselens.compiler.runtime.triton_precompile import precompile
from fuselens.compiler.runtime import wrapper_codegen
from fuselens.compiler.targets.base import cuda_device
from fuselens.kernel_timing import KernelTimer
from fuselens.private_dirs import check_private_file

_modules: dict[str, Any] = {}
_lock = threading.Lock()
# the most recently built graphs' libraries (debugging, tests): kernel name -> Launcher via .launchers
recent_libraries: "collections.deque[TritonLibrary]" = collections.deque(maxlen=16)


class TritonLibrary:
    """The launchers of one graph's module, by kernel name (what plan.py
    fetches with getattr, like a ctypes library)."""

    def __init__(self, module: Any, launchers: dict[str, Launcher], path: str) -> None:
        self.module = module
        self.path = path
        self.launchers = launchers
        for name, la in launchers.items():
            setattr(self, name, la)


def module_path(source: str, options: Any) -> str:
    key = hashlib.sha256(source.encode()).hexdigest()
    return os.path.join(options.resolved_cache_dir(), "triton", f"fl_{key[:40]}.py")


def build_module(kernels: Sequence[Any], source: str, options: Any, compile_id: str = "") -> TritonLibrary:
    """Write (once, atomically) and import a graph's Triton module."""
    path = module_path(source, options)
    with _lock:
        mod = _modules.get(path)
        if mod is None:
            if not os.path.exists(path):
                write_atomically(path, source)
            check_private_file(path)  # never import a module another account could have written
            name = os.path.basename(path)[:-3]
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod  # Triton resolves helper functions through the module's globals
            spec.loader.exec_module(mod)
            _modules[path] = mod
    launchers = {}
    for ks in kernels:
        launchers[ks.name] = Launcher(ks, getattr(mod, ks.name), options, ks.source)
    lib = TritonLibrary(mod, launchers, path)
    recent_libraries.append(lib)
    precompile(lib, options, compile_id)
    return lib


def finalize(runner: Any, lib: Optional[TritonLibrary], options: Any, graph_id: str,
             example_inputs: Sequence[Any], timer: Optional[KernelTimer] = None) -> tuple[Any, list]:
    """Attach the Triton parts to a compiled graph's runner: the device outputs
    are allocated on, the graph's kernel timer (its launchers', or the CUDA graph's
    replays), and the optional CUDA-graph wrapper. Returns (callable, extra events)."""
    runner.device = cuda_device(example_inputs)
    mutated = list(getattr(runner, "mutated_inputs", ()))
    on_cuda = runner.device is not None
    if lib is not None and not (on_cuda and options.cuda_graphs):
        for la in lib.launchers.values():
            la.kernel_timer = timer
    runner = wrapper_codegen.wrap(runner, fast=on_cuda) or runner  # straight-line Python, not the plan interpreter
    if on_cuda and options.cuda_graphs:
        stage = graph_stage(graph_id)
        backward = stage == "aot_backward"
        static = static_input_indices(backward=backward)
        grads = gradient_output_indices() if backward else set()
        # a training forward's outputs after the user's are saved for its backward
        saved_from = forward_user_outputs() if stage == "aot_forward" else None
        return CudaGraphRunner(runner, graph_id, timer, static, mutated, grads, saved_from,
                               inference=stage == "aot_inference"), []
    return runner, []
