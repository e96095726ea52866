"""Targets by the name option `target` gives them (as Inductor registers a
backend per device with `register_backend_for_device`)."""

from __future__ import annotations

import os
from typing import Any

from fuselens.compiler.targets.base import Target, runs_on_cuda
from fuselens.compiler.targets.cpp import CppTarget
from fuselens.compiler.targets.triton import TritonTarget

_TARGETS: dict[str, Target] = {}


def register_target(target: Target) -> None:
    """Make `target` the one option target=`target.name` compiles with."""
    _TARGETS[target.name] = target


def get_target(name: str) -> Target:
    return _TARGETS[name]


def resolve_target(target: str, example_inputs: Any) -> str:
    """Option `target` for these inputs: "auto" is "triton" when the inputs are
    CUDA tensors and "cpp" otherwise; "triton" on CPU tensors only runs under
    TRITON_INTERPRET=1 (tests), else it raises (the graph then runs eagerly)."""
    on_cuda = runs_on_cuda(example_inputs)
    if target == "auto":
        return "triton" if on_cuda else "cpp"
    if target == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("option target='triton' needs CUDA tensors (or TRITON_INTERPRET=1 to run the "
                           "kernels in Triton's CPU interpreter)")
    if target == "cpp" and on_cuda:
        raise RuntimeError("option target='cpp' cannot run on CUDA tensors; use target='triton' or 'auto'")
    return target


register_target(CppTarget())
register_target(TritonTarget())
