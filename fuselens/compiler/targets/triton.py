"""The Triton target: kernels of codegen/triton.py in a module imported by
runtime/triton_module.py, JIT-compiled at first launch (or before, by the
compile pool). Triton itself is imported only when this target is used."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx

from fuselens.compiler import graph_passes, layout_passes, split_reductions
from fuselens.compiler.codegen import GeneratedLibrary
from fuselens.compiler.targets.base import Target, cuda_device
from fuselens.kernel_timing import KernelTimer


class TritonTarget(Target):
    name = "triton"
    kernel_prefix = "triton_fused"
    build_phase = "triton_compile"
    host_timing = False  # the launchers time kernels with the graph's KernelTimer instead (finalize)

    def graph_rewrites(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], stage: str) -> list:
        device = cuda_device(example_inputs)
        if device is None:
            return []
        # an inference graph's outputs are only the user's: a padded row stride is fine there; a
        # forward's also feed its backward, compiled for eager's layouts
        done = graph_passes.pad_unaligned_matmuls(gm, padded_outputs=stage == "aot_inference")
        done += graph_passes.index_put_accumulate_as_index_add(gm)
        done += layout_passes.channels_last_for_stage(gm, stage, require_cuda=True)
        done += graph_passes.convolution_bias_as_add(gm)
        # after the layout rules: whether a reduction's kept dim is its contiguous one depends on them
        return done + split_reductions.split_reductions(gm, torch.cuda.get_device_properties(device).multi_processor_count)

    def codegen(self) -> Any:
        from fuselens.compiler.codegen import triton

        return triton

    def combo_part(self, group: Any, graph: Any, options: Any) -> bool:
        from fuselens.compiler.codegen.triton_combo import combo_part

        return combo_part(group, graph, options)

    def build(self, library: GeneratedLibrary, options: Any, compile_id: str) -> Any:
        from fuselens.compiler.runtime.triton_module import build_module

        return build_module(list(library.kernels.values()), library.source, options, compile_id) \
            if not library.empty else None

    def finalize(self, runner: Any, lib: Any, options: Any, graph_id: str,
                 example_inputs: Sequence[Any], timer: Optional[KernelTimer] = None) -> tuple[Callable, list]:
        """Device allocation, kernel timing, the generated wrapper and the optional CUDA graph."""
        from fuselens.compiler.runtime.triton_module import finalize

        return finalize(runner, lib, options, graph_id, example_inputs, timer)
