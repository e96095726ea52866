"""Straight-line Python for a compiled graph (the host path), both targets.

`GraphRunner` (interpreter.py) interprets the plan: a dict of buffers, an
`isinstance` chain and `_resolve` over nested argument trees for every step of
every call. On the GPU that host work, not the kernels, bounded the models
(GPT-2 and ResNet blocks ran at ~1.5-2.4x their CUDA-graph replay time); on the
CPU it runs with caches the kernel has just flushed: around layernorm 4k x 1k's
0.58 ms kernel, the host time of a compiled call (Dynamo's included) went from
78 us with the interpreter to 61 us generated. Like
Inductor's `call(args)`, `generate_wrapper` prints the plan once as a Python
function: buffers are locals, sizes of static graphs are literals, externs are
direct calls with their arguments already spelled out, every buffer is `del`eted
at its last use (the CUDA caching allocator hands the block to the next
allocation of that size), and each Triton kernel is called through
`Launcher.fast_launcher` (triton_launcher.py), which calls the compiled kernel's
launcher directly. On the CPU a dead buffer instead waits in a local for the
next allocation of its byte size, which takes it over with `as_strided`: the
reuse interpreter.py's pool does by hand for malloc (large blocks go back to the
OS, and a fresh one costs a page fault per 4 KiB), resolved here while printing
when the sizes are static. C++ kernels get data pointers.

    def call(args):
        arg0_1, arg1_1 = args
        args.clear()
        stream = _stream(0)
        b_convolution = _e0(arg1_1, arg0_1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        del arg0_1
        b_relu = _empty((64, 64, 56, 56), (200704, 1, 3584, 64), _dt0)
        _k1(stream, b_convolution, ..., b_relu)
        del b_convolution
        return [b_relu]

`wrap(runner)` returns a callable with the runner's interface (boxed calling
convention, `timer`, `device`, `graph_id`) or None when the plan holds
something the printer does not know (then the GraphRunner stays).
"""

from __future__ import annotations

import bisect
import contextlib
import linecache
import math
import re
from typing import Any, Iterator, Optional, Sequence

import torch

from fuselens.compiler.runtime.buffer_reuse import reuse_map
from fuselens.compiler.runtime.interpreter import ExternCall, Free, KernelCall, alloc_nbytes, pool_put

_ids = iter(range(1 << 62))


def _stream_getter() -> Any:
    """The current CUDA stream as an int, without building a Stream object
    (`torch._C._cuda_getCurrentRawStream`, what Inductor's wrapper calls)."""
    fn = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if fn is not None:
        return fn
    return lambda idx: torch.cuda.current_stream(idx).cuda_stream  # pragma: no cover - older torch


class _Printer:
    def __init__(self, runner: Any) -> None:
        self.r = runner
        self.ns: dict[str, Any] = {"torch": torch}
        self.names: dict[str, str] = {}  # buffer -> local variable
        self.used: set[str] = set()
        self.lines: list[str] = []
        self.static = runner._static_slots
        self.globals_by_id: dict[int, str] = {}
        self.empty_fast = False  # allocate with torch._C._dynamo.guards._empty_strided_{cuda,cpu}
        self.device_guard = False
        self.host_pool = False  # CPU: dead reusable buffers are taken over by later allocations
        self.pool: dict[tuple, list[str]] = {}  # static shapes: (dtype, nbytes) -> dead locals
        self.nbytes: dict[str, tuple] = {}  # local -> (dtype, nbytes) of what it was allocated as
        self.kernel_reads = {b for st in runner.plan if isinstance(st, KernelCall) for b in st.buffers}
        self.takes: dict[str, str] = {}  # GPU, static shapes: allocation -> the dead buffer it takes over
        self.taken: set[str] = set()  # the dead buffers in `takes`
        self.held: dict[str, str] = {}  # dead buffers kept for the allocation taking them -> their local
        self.const_lines: dict[int, str] = {}  # line index -> the constant's local it binds
        self.step_lines: list[tuple[int, str]] = []  # (first line, step name), in order

    # -- names
    def local(self, buf: str) -> str:
        v = self.names.get(buf)
        if v is None:
            base = "b_" + re.sub(r"\W", "_", buf)
            v, i = base, 0
            while v in self.used:
                i += 1
                v = f"{base}_{i}"
            self.used.add(v)
            self.names[buf] = v
        return v

    def glob(self, obj: Any, prefix: str) -> str:
        key = id(obj)
        name = self.globals_by_id.get(key)
        if name is None:
            name = f"_{prefix}{len(self.globals_by_id)}"
            self.globals_by_id[key] = name
            self.ns[name] = obj
        return name

    # -- values
    def slot(self, i: int) -> str:
        if self.static is not None:
            return self.lit(self.static[i])
        return f"slots[{i}]"

    def tuple_slot(self, i: int) -> str:
        """A sizes/strides slot as a tuple (what the C++ allocation helpers accept)."""
        if self.static is not None:
            return self.lit(tuple(self.static[i]))
        return f"tuple(slots[{i}])"

    def lit(self, a: Any) -> str:
        """A constant as source (lists/tuples of ints print; anything else is a global)."""
        if a is None or isinstance(a, (bool, str)):
            return repr(a)
        if isinstance(a, int):
            return repr(int(a))
        if isinstance(a, float):
            return repr(a) if math.isfinite(a) else f"float({str(a)!r})"
        if isinstance(a, list):
            return "[" + ", ".join(self.lit(x) for x in a) + "]"
        if isinstance(a, tuple):
            return "(" + "".join(self.lit(x) + ", " for x in a) + ")"
        return self.glob(a, "c")

    def arg(self, a: Any) -> str:
        """A plan argument tree (("buf", name) / ("sym", slot) leaves) as source."""
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "buf":
            return self.names[a[1]]
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "sym":
            return self.slot(a[1])
        if isinstance(a, list):
            return "[" + ", ".join(self.arg(x) for x in a) + "]"
        if isinstance(a, tuple):
            return "(" + "".join(self.arg(x) + ", " for x in a) + ")"
        if isinstance(a, dict):
            return "{" + ", ".join(f"{k!r}: {self.arg(v)}" for k, v in a.items()) + "}"
        return self.lit(a)

    # -- the function
    def emit(self, text: str) -> None:
        self.lines.append("    " + text)

    def build(self, fast: bool) -> str:
        r = self.r
        self._bind_inputs()
        syms = self._bind_symbols()
        head = len(self.lines)  # what runs under the device guard starts here
        idx = self._runtime_helpers(fast)
        for step in r.plan:
            if isinstance(step, (KernelCall, ExternCall)):
                self.step_lines.append((len(self.lines), step.name))
            if isinstance(step, KernelCall):
                self.kernel(step, syms, fast)
            elif isinstance(step, ExternCall):
                self.extern(step)
            elif isinstance(step, Free):
                self.free(step)
            else:
                raise NotImplementedError(type(step).__name__)
        self.emit(f"return [{', '.join(self.arg(o) for o in r.outputs)}]")
        dropped = self._drop_unread_constants()
        head -= dropped
        if self.device_guard:
            body = self.lines[head:]
            self.lines[head:] = [f"    with _guard({int(idx)}):"] + ["    " + ln for ln in body]
        # each step's first line in the source (line 1 is the def; the steps come after the
        # constants and the guard)
        self.step_lines = [(i + 2 - dropped + int(self.device_guard), name) for i, name in self.step_lines]
        return "def call(args):\n" + "\n".join(self.lines) + "\n"

    def _bind_inputs(self) -> None:
        ins = [self.local(n) for n in self.r.input_names]
        if ins:
            self.emit(f"{', '.join(ins)}{',' if len(ins) == 1 else ''} = args")
        self.emit("args.clear()")  # boxed convention: the caller's list no longer pins the inputs
        for name, value in self.r.constants.items():
            self.const_lines[len(self.lines)] = self.local(name)
            self.emit(f"{self.local(name)} = {self.glob(value, 'k')}")

    def _drop_unread_constants(self) -> int:
        """Deletes the bindings of constants nothing in the body reads (a 0-d literal inlined into
        every kernel that reads it, a folded constant only its shape was needed of): each is a
        store on every call's hot path. Returns how many lines went."""
        body = "\n".join(ln for i, ln in enumerate(self.lines) if i not in self.const_lines)
        read = set(re.findall(r"\bb_\w+", body))
        unread = {i for i, var in self.const_lines.items() if var not in read}
        self.lines = [ln for i, ln in enumerate(self.lines) if i not in unread]
        return len(unread)

    def _bind_symbols(self) -> dict[str, str]:
        """Size symbols read off the inputs, and the size/stride slots computed from them;
        returns each symbol's local variable."""
        syms: dict[str, str] = {}
        for name, src in self.r.symbol_sources.items():
            var = syms[name] = "s_" + re.sub(r"\W", "_", name)
            if src[0] == "arg":
                self.emit(f"{var} = int({self.names[src[1]]})")
            elif src[0] == "size":
                self.emit(f"{var} = int({self.names[src[1]]}.shape[{int(src[2])}])")
            else:
                self.emit(f"{var} = int({self.names[src[1]]}.stride({int(src[2])}))")
        if self.static is None:
            self.ns["_symeval"] = self.r.symeval
            self.emit("slots = _symeval({" + ", ".join(f"{n!r}: {v}" for n, v in syms.items()) + "})")
        return syms

    def _runtime_helpers(self, fast: bool) -> int:
        """The globals the body calls (allocation, stream, pool, timing); returns the device index."""
        r = self.r
        dev = r.device
        self.ns["_empty"] = torch.empty_strided
        reinterpret = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_reinterpret_tensor", None)
        if reinterpret is not None:
            self.ns["_reinterpret"] = reinterpret
        self.ns["_dev"] = dev
        guard = getattr(torch.cuda, "_DeviceGuard", None)
        helpers = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
        on_cuda = dev is not None and dev.type == "cuda"
        # allocate with the C++ helpers Inductor's wrapper uses (~1 us, not ~2.5; sizes as tuples); the
        # CUDA one allocates on the current device, so the body runs under a device guard (Triton
        # launches on the current device too)
        fast_empty = getattr(helpers, "_empty_strided_cuda" if on_cuda else "_empty_strided_cpu", None)
        if fast_empty is not None and (guard is not None or not on_cuda):
            self.ns["_empty_fast"] = fast_empty
            self.empty_fast = True
        idx = 0
        launches = any(isinstance(st, KernelCall) and (st.takes_tensors or getattr(st.fn, "takes_tensors", False))
                       for st in r.plan)
        if fast and on_cuda:
            self.ns["_stream"] = _stream_getter()
            idx = dev.index if dev.index is not None else torch.cuda.current_device()
            self.emit(f"stream = _stream({int(idx)})")
        elif launches:
            self.emit("stream = None")
        # Triton graphs take dead buffers over by buffer_reuse's plan, on the GPU and in Triton's
        # interpreter on the CPU (where the tests run it); C++ graphs by the host pool below
        if self.static is not None and r.storage is not None and (on_cuda or launches):
            self.takes = reuse_map(r.plan, r.storage)
            self.taken = set(self.takes.values())
        self.host_pool = not on_cuda and not launches
        if self.host_pool and self.static is None:
            from fuselens.compiler.runtime.interpreter import _alloc

            self.ns["_alloc"] = _alloc
            self.ns["_pool_put"] = pool_put
            self.emit("pool = {}")
        if r.timer is not None:
            import time

            self.ns["_pc"] = time.perf_counter
            self.ns["_tick"] = r.timer.record
        if on_cuda and self.empty_fast:
            self.ns["_guard"] = guard
            self.device_guard = True
        return idx

    def free(self, step: Free) -> None:
        """Buffers dead after this point: deleted, or kept for a later allocation of their size."""
        dead = []
        for n in step.names:
            var = self.names.pop(n, None)
            if var is None:
                continue
            if n in self.taken:
                self.held[n] = var  # alive in its local until the allocation taking it
                continue
            if self.host_pool and n in self.r.reusable:
                if self.static is None:
                    self.emit(f"_pool_put(pool, {var})")
                elif var in self.nbytes:
                    self.pool.setdefault(self.nbytes[var], []).append(var)
                    continue  # stays alive in its local until an allocation takes it over
            dead.append(var)
        if dead:
            self.emit(f"del {', '.join(dead)}")

    def kernel(self, step: KernelCall, syms: dict[str, str], fast: bool) -> None:
        la = step.fn
        tensors = step.takes_tensors or getattr(la, "takes_tensors", False)
        if not tensors and self.r.device is not None:
            raise NotImplementedError("a C++ kernel on a device")
        for name, sz, st, dtype in step.alloc:
            src = step.reuse.get(name) if step.reuse else None
            var = self.local(name)
            if src is not None and name in step.restride:  # in place, through a view of the output's shape
                self.emit(f"{var} = {self.names[src]}.as_strided({self.tuple_slot(sz)}, {self.tuple_slot(st)})")
            elif src is not None:  # in place: the input dies at this call (plan.py checked it)
                self.emit(f"{var} = {self.names[src]}")
            elif self.host_pool and self.static is None:
                self.emit(f"{var} = _alloc(pool, {self.slot(sz)}, {self.slot(st)}, {self.glob(dtype, 'dt')})")
            elif self.host_pool and self._take_pooled(var, sz, st, dtype):
                pass
            elif self.takes.get(name) in self.held:
                self.emit(f"{var} = {self._take_held(name)}")
                self.emit(f"del {self.held.pop(self.takes[name])}")
            elif self.empty_fast:
                self.emit(f"{var} = _empty_fast({self.tuple_slot(sz)}, {self.tuple_slot(st)}, {self.glob(dtype, 'dt')})")
            else:
                self.emit(f"{var} = _empty({self.slot(sz)}, {self.slot(st)}, dtype={self.glob(dtype, 'dt')}, "
                          "device=_dev)")
        if not tensors:  # a ctypes function of the C++ library
            call_args = [f"{self.names[b]}.data_ptr()" for b in step.buffers] + [syms[s] for s in step.symbols]
            call = f"{self.glob(la, 'k')}({', '.join(call_args)})"
            if self.r.timer is not None:
                self.emit("_t0 = _pc()")
                self.emit(call)
                self.emit(f"_tick({step.name!r}, _pc() - _t0)")
            else:
                self.emit(call)
            return
        if getattr(la, "statically_empty", lambda: False)():
            return  # its outputs are allocated above, empty; a grid of no blocks is no launch
        call_args = [self.names[b] for b in step.buffers] + [syms[s] for s in step.symbols]
        fn = la.fast_launcher() if fast else None
        if fn is not None:
            self.emit(f"{self.glob(fn, 'k')}(stream, {', '.join(call_args)})")
        else:
            self.emit(f"{self.glob(la, 'k')}({', '.join(call_args)})")

    def _take_pooled(self, var: str, sz: int, st: int, dtype: torch.dtype) -> bool:
        """Static shapes: allocate `var` by taking over a dead buffer of the same byte size
        (what runtime._alloc does per call, decided once here). False: allocate fresh."""
        size, stride = self.static[sz], self.static[st]
        key = self.nbytes[var] = (dtype, alloc_nbytes(size, stride, dtype))
        free = self.pool.get(key)
        if not free:
            return False
        old = free.pop()
        self.emit(f"{var} = {old}.as_strided({self.lit(tuple(size))}, {self.lit(tuple(stride))}, 0)")
        self.emit(f"del {old}")
        return True

    def _pooled_for(self, step: ExternCall) -> Optional[str]:
        """A dead buffer of the host pool a matmul's result may be written into (`out=`), as
        kernels' outputs take them (`_take_pooled`); None: the library allocates it. Each fresh
        result of megabytes is memory the C library maps anew and the matmul's first touch
        faults in: ConvNeXt-T inference on a 2-core CPU copied its Linear biases into fresh
        results at 143 us a call against Inductor's 27, which hands them dead buffers."""
        dtype = step.dtypes.get(step.outputs) if isinstance(step.outputs, str) else None
        if dtype is None:
            return None
        size, stride = step.out_layout
        key = (dtype, alloc_nbytes(size, stride, dtype))
        self.nbytes[self.local(step.outputs)] = key  # pooled in turn once it dies (`free`)
        free = self.pool.get(key)
        return free.pop() if free else None

    def _take_held(self, name: str) -> str:
        """The expression giving allocation `name` the storage of the dead buffer it takes."""
        old = self.takes[name]
        var = self.held[old]
        layout = self.r.storage.layout
        size, stride = layout[name]
        if layout.get(old) == (size, stride):
            return var
        if "_reinterpret" in self.ns:
            return f"_reinterpret({var}, {self.lit(size)}, {self.lit(stride)}, 0)"
        return f"{var}.as_strided({self.lit(size)}, {self.lit(stride)}, 0)"

    def extern(self, step: ExternCall) -> None:
        a = ", ".join(self.arg(x) for x in step.args)
        k = ", ".join(f"{key}={self.arg(v)}" for key, v in step.kwargs.items())
        into = release = None
        if step.out_layout is not None and self.takes.get(step.outputs) in self.held:
            into = self._take_held(step.outputs)
            release = self.held.pop(self.takes[step.outputs])
        elif step.out_layout is not None and self.host_pool and self.static is not None:
            release = self._pooled_for(step)
            if release is not None:
                size, stride = step.out_layout
                into = f"{release}.as_strided({self.lit(tuple(size))}, {self.lit(tuple(stride))}, 0)"
        if into is not None:
            k = ", ".join(p for p in (k, f"out={into}") if p)
        call = f"{self.glob(_direct(step.target), 'e')}({', '.join(p for p in (a, k) if p)})"
        method = _VIEW_METHODS.get(step.target)
        if step.reinterpret is not None and "_reinterpret" in self.ns:
            # a view of a buffer laid out as traced: its result re-created directly (~1.3 us on the
            # H100 host, against ~4.6 for Tensor.view and ~8 for the OpOverload), as Inductor does
            size, stride, shift = step.reinterpret
            call = f"_reinterpret({self.arg(step.args[0])}, {self.lit(size)}, {self.lit(stride)}, {shift})"
        elif method is not None and step.args and not step.kwargs:
            # a view the runtime re-runs: the Tensor method, not the OpOverload (~1 us, not ~8)
            rest = ", ".join(self.arg(x) for x in step.args[1:])
            call = f"{self.arg(step.args[0])}.{method}({rest})"
        if step.timed is not None and self.r.timer is not None:  # host clock, as for C++ kernels
            self.emit("_t0 = _pc()")
            tail = f"_tick({step.timed!r}, _pc() - _t0)"
        else:
            tail = None
        if isinstance(step.outputs, list):
            tmp = "_t"
            self.emit(f"{tmp} = {call}")
            if tail:
                self.emit(tail)
            for i, n in enumerate(step.outputs):
                if n is not None:
                    self.emit(f"{self.local(n)} = {tmp}[{i}]")
            self.emit(f"del {tmp}")
        else:
            self.emit(f"{self.local(step.outputs)} = {call}")
            if tail:
                self.emit(tail)
            if release is not None:
                self.emit(f"del {release}")
        for n, dt in step.dtypes.items():  # where kernels read it, in the dtype they were generated for
            if n in self.kernel_reads:
                var, d = self.names[n], self.glob(dt, "dt")
                self.emit(f"if {var}.dtype is not {d}: {var} = {var}.to({d})")


# Library calls whose torch.* binding takes exactly the ATen schema's arguments: calling it
# skips the OpOverload's schema-driven argument conversion (measured on CPU: convolution
# 21 -> 11 us, addmm 12 -> 7 us per call; same ATen kernel).
_DIRECT = ("addmm", "mm", "bmm", "baddbmm", "convolution", "_scaled_dot_product_flash_attention",
           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention", "_addmm_activation")


# View ops whose Tensor method takes the schema's arguments after `self`, in order.
_VIEW_METHODS = {
    torch.ops.aten.view.default: "view",
    torch.ops.aten._unsafe_view.default: "view",  # only made of contiguous results: view is valid
    torch.ops.aten.reshape.default: "reshape",
    torch.ops.aten.permute.default: "permute",
    torch.ops.aten.transpose.int: "transpose",
    torch.ops.aten.t.default: "t",
    torch.ops.aten.expand.default: "expand",
    torch.ops.aten.unsqueeze.default: "unsqueeze",
    torch.ops.aten.squeeze.dim: "squeeze",
    torch.ops.aten.select.int: "select",
}


def _direct(target: Any) -> Any:
    from fuselens.compiler import library_epilogues, random_ops

    if target is torch.ops.fuselens.conv2d_bias_relu.default:
        return library_epilogues.conv2d_bias_relu_impl
    if target is random_ops.SEEDS:
        return random_ops.draw_seeds
    for name in _DIRECT:
        op = getattr(getattr(torch.ops.aten, name, None), "default", None)
        if op is not None and target is op:
            return getattr(torch, name, target)
    return target


class GeneratedWrapper:
    """A compiled graph's generated `call(args)` with the GraphRunner's interface."""

    _boxed_call = True

    def __init__(self, fn: Any, source: str, runner: Any, takes: Optional[dict[str, str]] = None,
                 filename: str = "", step_lines: Sequence[tuple[int, str]] = ()) -> None:
        self.fn = fn
        self.source = source
        self.filename = filename  # what tracebacks through `fn` name its frames
        self.step_lines = list(step_lines)  # (first source line, plan step name), in order
        self.runner = runner  # the plan it was printed from: for debugging, tests and pool_reserve
        self.takes = takes or {}  # allocation -> the dead buffer it took over (buffer_reuse)
        self.timer = runner.timer
        self.device = runner.device
        self.graph_id = getattr(runner, "graph_id", "")

    def __call__(self, args: list) -> Any:
        return self.fn(args)

    def failed_step(self, error: BaseException) -> Optional[tuple[str, BaseException]]:
        """The plan step `error` was raised in (its name), and the error raised there: `error`
        itself or one it was raised while handling (a CUDA-graph capture's end raises its own
        error over the one a step raised); None when none came from this wrapper."""
        seen: set[int] = set()
        e: Optional[BaseException] = error
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            line = None
            tb = e.__traceback__
            while tb is not None:  # the innermost frame of ours
                if tb.tb_frame.f_code.co_filename == self.filename:
                    line = tb.tb_lineno
                tb = tb.tb_next
            if line is not None:
                at = bisect.bisect_right([ln for ln, _ in self.step_lines], line) - 1
                return (self.step_lines[at][1], e) if at >= 0 else None
            e = e.__cause__ or e.__context__
        return None


def wrap(runner: Any, fast: bool = True) -> Optional[GeneratedWrapper]:
    """`runner` (a GraphRunner) as generated straight-line Python; None when its
    plan has something the printer does not handle. `fast`: launch Triton
    kernels through their compiled launchers (CUDA only)."""
    try:
        p = _Printer(runner)
        src = p.build(fast)
    except (NotImplementedError, KeyError, AttributeError):
        return None
    ns = p.ns
    filename = f"<fuselens-wrapper-{next(_ids)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # tracebacks show the line
    exec(compile(src, filename, "exec"), ns)  # noqa: S102 - our own printed plan
    for sources in _recording:
        sources.append(src)
    return GeneratedWrapper(ns["call"], src, runner, p.takes, filename, p.step_lines)


_recording: list[list[str]] = []


@contextlib.contextmanager
def recorded_sources() -> Iterator[list[str]]:
    """The source of every wrapper generated inside the block, in order (a benchmark
    keeps them; tests read them)."""
    sources: list[str] = []
    _recording.append(sources)
    try:
        yield sources
    finally:
        _recording.remove(sources)
