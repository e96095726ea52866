"""The interface of a compile target: everything the driver does differently per target."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch.fx

from fuselens.compiler.codegen import GeneratedLibrary, generate_library
from fuselens.kernel_timing import KernelTimer


def cuda_device(example_inputs: Sequence[Any]) -> Optional[torch.device]:
    """The CUDA device a graph with these inputs runs on: its first CUDA tensor's, not its first
    tensor's (a 0-d CPU tensor, such as an optimizer's step count, may come first); None if none."""
    return next((a.device for a in example_inputs if isinstance(a, torch.Tensor) and a.device.type == "cuda"), None)


def runs_on_cuda(example_inputs: Sequence[Any]) -> bool:
    """Whether a graph with these inputs runs on a CUDA device (any input a CUDA tensor)."""
    return cuda_device(example_inputs) is not None


def with_graph_device(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list:
    """`example_inputs`, and where none is a CUDA tensor but a value the graph computes is,
    that value too: what the device decisions above read. A graph may read no CUDA tensor
    and still compute on the GPU: an attention mask built from `torch.arange(n,
    device=...)` alone, or a batch copied to the GPU inside the compiled function.
    Compiled for the CPU, such a mask comes out on the CPU (the likely cause of BART's and
    Mixtral's failures on the H200, where a CPU mask reached the next graph's attention)."""
    inputs = list(example_inputs)
    if runs_on_cuda(inputs):
        return inputs
    for n in gm.graph.nodes:
        v = n.meta.get("val", n.meta.get("example_value"))
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                return [*inputs, t]  # its fake value: read for its device only
    return inputs


class Target:
    """One code-generation target. The driver runs, in order: `graph_rewrites`,
    (lowering and scheduling with `kernel_prefix`), `generate`, `build`, the plan,
    `finalize`."""

    name: str  # the value of option `target`
    kernel_prefix: str  # kernel names: `<prefix>_<ops>_<n>`
    build_phase: str  # the PhaseTime phase `build` is reported as
    host_timing: bool  # whether the plan's own steps are timed by the graph's KernelTimer on the host clock
    # whether exp/sin/... recomputed for every element of a broadcasting reader cost more than a
    # load (a CPU's libm-like polynomials) or not (a GPU's special-function units)
    costly_math: bool = False

    def graph_rewrites(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], stage: str) -> list:
        """The graph_passes.py rewrites only this target wants (beyond the shared ones)."""
        return []

    def codegen(self) -> Any:
        """The code generator module (the interface in codegen/__init__.py)."""
        raise NotImplementedError

    def generate(self, groups: Sequence[Any], graph: Any, options: Any) -> GeneratedLibrary:
        """Kernel source for every kernel group of the schedule."""
        return generate_library(self.codegen(), groups, graph, options)

    def combo_part(self, group: Any, graph: Any, options: Any) -> bool:
        """Whether kernel `group` may run as a part of a combo kernel (compiler/combo_kernels.py)."""
        return False

    def build(self, library: GeneratedLibrary, options: Any, compile_id: str) -> Any:
        """The compiled library (kernel name -> callable attribute); None when it holds no kernel."""
        raise NotImplementedError

    def finalize(self, runner: Any, lib: Any, options: Any, graph_id: str,
                 example_inputs: Sequence[Any], timer: Optional[KernelTimer] = None) -> tuple[Callable, list]:
        """The callable that runs the compiled graph, and extra events about it. `timer`:
        the graph's kernel timer (option time_kernels), for what the plan does not time."""
        raise NotImplementedError
