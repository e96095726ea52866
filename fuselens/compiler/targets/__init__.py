"""Targets: what differs between compiling a graph to C++ and to Triton.

    base.py     the `Target` interface the driver (entry.compile_graph) calls
    cpp.py      C++/OpenMP kernels built with g++ into a shared library
    triton.py   Triton kernels in an imported module, launched on CUDA
    registry.py targets by option name (`register_target`, `get_target`,
                `resolve_target` for option target="auto")

A new target implements `Target` and registers itself in registry.py.
"""
