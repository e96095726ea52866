"""The runtime wrapper: runs a scheduled graph.

`GraphRunner(args)` (boxed: one list of inputs, which it clears so inputs can be
freed early, as AOTAutograd's boxed convention allows) evaluates the size
symbols from the inputs, then walks a flat plan: allocate a kernel's outputs
with their symbolic sizes/strides (reusing the storage of dead intermediates of
the same size), call the kernel through ctypes with data pointers and sizes,
run externs/fallbacks with ATen, re-create views that an extern or an output
needs (free: the ATen view op), and drop every buffer right after its last use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import sympy
import torch
import torch.fx

from fuselens.compiler import ir
from fuselens.kernel_timing import KernelTimer


def pyexpr(e: Any) -> str:
    """A sympy size expression as Python source (symbols are local names)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(pyexpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(pyexpr(a) for a in e.args) + ")"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer:
        return f"({pyexpr(e.base)} ** {int(e.exp)})"
    if isinstance(e, ir.FloorDiv):
        return f"({pyexpr(e.args[0])} // {pyexpr(e.args[1])})"
    if isinstance(e, ir.ModularIndexing):
        return f"(({pyexpr(e.args[0])} // {pyexpr(e.args[1])}) % {pyexpr(e.args[2])})"
    if isinstance(e, (sympy.Min, sympy.Max)):
        fn = "min" if isinstance(e, sympy.Min) else "max"
        return f"{fn}({', '.join(pyexpr(a) for a in e.args)})"
    if isinstance(e, sympy.Rational):
        return f"({e.p} / {e.q})"
    if e.is_Float:
        return repr(float(e))
    # anything else (sympy functions in SymInt arithmetic): evaluate through sympy
    raise NotImplementedError(str(e))


class SymEval:
    """Compiles size expressions into one Python function of the symbol values."""

    def __init__(self, symbols: Sequence[sympy.Symbol]) -> None:
        self.symbols = list(symbols)
        self.exprs: list[Any] = []

    def add(self, e: Any) -> int:
        self.exprs.append(e)
        return len(self.exprs) - 1

    def compile(self) -> Callable[[dict], list]:
        names = [s.name for s in self.symbols]
        try:
            body = ", ".join(pyexpr(e) for e in self.exprs)
            src = f"def _f({', '.join(names)}):\n    return [{body}]\n"
            ns: dict[str, Any] = {}
            exec(src, ns)  # noqa: S102 - our own printed arithmetic
            fn = ns["_f"]
            return lambda env: fn(*[env[n] for n in names])
        except NotImplementedError:
            exprs = [sympy.sympify(e) for e in self.exprs]
            return lambda env: [int(e.subs({s: env[s.name] for s in self.symbols})) for e in exprs]


@dataclass(frozen=True)
class StepOrigin:
    """What a plan step computes, in the user's terms: its ATen ops and the stack trace
    of the first that has one (a failure at run time names them and their line)."""

    ops: tuple[str, ...]
    stack_trace: str = ""


@dataclass
class KernelCall:
    name: str
    fn: Any
    buffers: list[str]
    outputs: list[str]
    alloc: list[tuple[str, int, int, torch.dtype]]  # name, sizes slot, strides slot, dtype
    symbols: list[str]
    reuse: dict[str, str] = field(default_factory=dict)  # output -> dying input whose storage it takes
    restride: set[str] = field(default_factory=set)  # reused outputs viewed with their own sizes and strides
    takes_tensors: bool = False  # Triton launchers take tensors, not data pointers


@dataclass
class ExternCall:
    name: str
    target: Any
    args: Any  # with ("buf", name) / ("sym", slot) leaves
    kwargs: Any
    outputs: Any  # name or list of names (tuple results)
    # output -> the dtype the kernels expect: torch's meta function and ATen can disagree
    # (_batch_norm_with_update_functional's bfloat16 running stats are float32 in meta)
    dtypes: dict = field(default_factory=dict)
    # the Kernel event name (extern_mm_0) when the graph has a timer (option time_kernels): the
    # call is timed on the host clock like a C++ kernel; None for views re-created by the runtime
    timed: Optional[str] = None
    # a view of a buffer whose layout the plan knows, with static sizes: (size, stride,
    # storage offset from its base), which the wrapper re-creates without ATen's view checks
    reinterpret: Optional[tuple] = None
    # a matmul whose static, contiguous result may be written into a dead buffer given as
    # `out=` (buffer_reuse.py): (size, stride)
    out_layout: Optional[tuple] = None


@dataclass
class Free:
    names: list[str]


class GraphRunner:
    """A compiled graph ready to run (boxed calling convention)."""

    _boxed_call = True

    def __init__(self, plan: list[Any], input_names: list[str], symbol_sources: dict[str, tuple],
                 symeval: Callable[[dict], list], outputs: Any, reusable: set[str], timer: Optional[KernelTimer] = None,
                 constants: Optional[dict] = None) -> None:
        self.constants = dict(constants or {})
        self.plan, self.input_names, self.outputs, self.reusable = plan, input_names, outputs, reusable
        self.symbol_sources, self.symeval = symbol_sources, symeval
        self.timer = timer  # host-clock times of kernels and library calls (option time_kernels)
        self.device = None  # where kernel outputs are allocated; the Triton path sets cuda (triton_module.finalize)
        self.storage = None  # static graphs: buffer_reuse.StorageFacts (plan.py), for the GPU wrapper's reuse
        self.origins: dict[str, StepOrigin] = {}  # step name -> what it computes (plan.py)
        # static shapes: the size/stride slots never change, evaluate them once
        self._static_slots: Optional[list] = None if symbol_sources else (symeval({}) if symeval else [])

    def __call__(self, args: list) -> Any:
        env: dict[str, Any] = dict(zip(self.input_names, args))
        env.update(self.constants)
        if isinstance(args, list):
            args.clear()  # boxed convention: let inputs die as soon as we are done with them
        syms = self._symbol_values(env)
        slots = self._static_slots
        if slots is None:
            slots = self.symeval(syms) if self.symeval else []
        pool: dict[tuple, list[torch.Tensor]] = {}
        for step in self.plan:
            if isinstance(step, KernelCall):
                self._run_kernel(step, env, syms, slots, pool)
            elif isinstance(step, ExternCall):
                self._run_extern(step, env, slots)
            else:
                for n in step.names:
                    t = env.pop(n, None)
                    if n in self.reusable and t is not None:
                        pool_put(pool, t)
        return [_resolve(o, env, slots) for o in self.outputs]

    def _symbol_values(self, env: dict[str, Any]) -> dict[str, int]:
        """Each size symbol's value, read off the input it came from."""
        syms = {}
        for name, src in self.symbol_sources.items():
            kind = src[0]
            if kind == "arg":
                syms[name] = int(env[src[1]])
            elif kind == "size":
                syms[name] = int(env[src[1]].shape[src[2]])
            else:
                syms[name] = int(env[src[1]].stride(src[2]))
        return syms

    def _run_kernel(self, step: "KernelCall", env: dict[str, Any], syms: dict[str, int], slots: list,
                    pool: dict[tuple, list[torch.Tensor]]) -> None:
        for name, sz, st, dtype in step.alloc:
            src = step.reuse.get(name) if step.reuse else None
            if src is not None:  # in place: the input dies here (plan.py checked it)
                env[name] = env[src].as_strided(slots[sz], slots[st]) if name in step.restride else env[src]
            else:
                env[name] = _alloc(pool, slots[sz], slots[st], dtype, self.device)
        if step.takes_tensors or getattr(step.fn, "takes_tensors", False):  # Triton launchers take tensors
            ptrs = [env[b] for b in step.buffers]
        else:
            ptrs = [env[b].data_ptr() for b in step.buffers]
        sargs = [syms[s] for s in step.symbols]
        if self.timer is not None:
            t0 = time.perf_counter()
            step.fn(*ptrs, *sargs)
            self.timer.record(step.name, time.perf_counter() - t0)
        else:
            step.fn(*ptrs, *sargs)

    def _run_extern(self, step: "ExternCall", env: dict[str, Any], slots: list) -> None:
        a = _resolve(step.args, env, slots)
        k = _resolve(step.kwargs, env, slots)
        if self.timer is not None and step.timed is not None:
            t0 = time.perf_counter()
            out = step.target(*a, **k)
            self.timer.record(step.timed, time.perf_counter() - t0)
        else:
            out = step.target(*a, **k)
        if isinstance(step.outputs, list):
            for n, v in zip(step.outputs, out):
                if n is not None:
                    env[n] = v
        else:
            env[step.outputs] = out
        for n, dt in step.dtypes.items():
            if env[n].dtype != dt:
                env[n] = env[n].to(dt)


def alloc_nbytes(size: Sequence[int], stride: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes a strided allocation spans (the key buffers are reused by)."""
    if any(s == 0 for s in size):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(size, stride))) * dtype.itemsize


def pool_put(pool: dict, t: torch.Tensor) -> None:
    """A dead buffer waits in `pool` for the next allocation of its byte size (`_alloc`)."""
    pool.setdefault((t.dtype, t.untyped_storage().nbytes()), []).append(t)


def _alloc(pool: dict, size: list, stride: list, dtype: torch.dtype, device: Any = None) -> torch.Tensor:
    free = pool.get((dtype, alloc_nbytes(size, stride, dtype)))
    if free:
        t = free.pop()
        return t.as_strided(size, stride, 0)
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def _resolve(a: Any, env: dict, slots: list) -> Any:
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "buf":
        return env[a[1]]
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "sym":
        return slots[a[1]]
    if isinstance(a, list):
        return [_resolve(x, env, slots) for x in a]
    if isinstance(a, tuple):
        return tuple(_resolve(x, env, slots) for x in a)
    if isinstance(a, dict):
        return {k: _resolve(v, env, slots) for k, v in a.items()}
    return a

