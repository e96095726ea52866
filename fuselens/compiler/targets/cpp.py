"""The C++ target: OpenMP kernels (codegen/cpp.py) built by g++ (runtime/cpp_build.py)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from fuselens.compiler.codegen import GeneratedLibrary
from fuselens.compiler.runtime.cpp_build import build
from fuselens.compiler.runtime.interpreter import register_timing
from fuselens.compiler.runtime import wrapper_codegen
from fuselens.compiler.targets.base import Target


class CppTarget(Target):
    name = "cpp"
    kernel_prefix = "cpp_fused"
    build_phase = "cpp_compile"
    host_timing = True

    def codegen(self) -> Any:
        from fuselens.compiler.codegen import cpp

        return cpp

    def build(self, library: GeneratedLibrary, options: Any, compile_id: str) -> Any:
        return build(library.source, options, library.spans).lib if not library.empty else None

    def finalize(self, runner: Any, lib: Any, options: Any, graph_id: str,
                 example_inputs: Sequence[Any]) -> tuple[Callable, list]:
        runner = wrapper_codegen.wrap(runner, fast=False) or runner  # straight-line Python instead of the plan interpreter
        if runner.timing is not None:
            register_timing(graph_id, runner.timing)
        return runner, []
