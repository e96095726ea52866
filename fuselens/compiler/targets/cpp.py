"""The C++ target: OpenMP kernels (codegen/cpp.py) built by g++ (runtime/cpp_build.py)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from fuselens.compiler import graph_passes, layout_passes
from fuselens.compiler.codegen import GeneratedLibrary
from fuselens.compiler.runtime.cpp_build import build
from fuselens.compiler.runtime import wrapper_codegen
from fuselens.compiler.targets.base import Target
from fuselens.kernel_timing import KernelTimer


class CppTarget(Target):
    name = "cpp"
    kernel_prefix = "cpp_fused"
    build_phase = "cpp_compile"
    host_timing = True
    costly_math = True

    def graph_rewrites(self, gm: Any, example_inputs: Sequence[Any], stage: str) -> list:
        # oneDNN's convolutions run in NHWC too: given NCHW tensors they reorder every operand
        # in and the result out (MobileNetV3 inference, 2 cores: 145 ms of convolutions a
        # step in NCHW against Inductor's 62 in NHWC). Inference only: a training graph's
        # BatchNorm statistics would reduce over NHWC with the channels outermost
        # an embedding's gradient: ATen's index_add on the CPU is faster than index_put's
        # accumulating path (this 2-core machine, a 5003x256 word embedding over 256 tokens:
        # 0.58 -> 0.08 ms; 30522x768 over 4096: 33 -> 27 ms), and a library call, not an op
        # left to ATen (every Hugging Face training report had that finding)
        done = graph_passes.index_put_accumulate_as_index_add(gm, require_cuda=False)
        if stage != "aot_inference":
            return done
        return done + layout_passes.channels_last_for_stage(gm, stage, require_cuda=False)

    def codegen(self) -> Any:
        from fuselens.compiler.codegen import cpp

        return cpp

    def build(self, library: GeneratedLibrary, options: Any, compile_id: str) -> Any:
        return build(library.source, options, library.spans).lib if not library.empty else None

    def finalize(self, runner: Any, lib: Any, options: Any, graph_id: str,
                 example_inputs: Sequence[Any], timer: Optional[KernelTimer] = None) -> tuple[Callable, list]:
        # the plan's kernels are already timed by `timer` (host_timing)
        return wrapper_codegen.wrap(runner, fast=False) or runner, []  # straight-line Python instead of the plan interpreter
