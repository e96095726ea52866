"""Worker-side patches of torch.compile: graph capture, backend forcing,
call counting (max_calls). Imports torch; only the worker imports this.

- Every backend Dynamo resolves goes through `eval_frame.get_compiler_fn`
  (torch.compile and torch._dynamo.optimize both), so patching it sees every
  backend, the program's own or a forced one, and wraps it in
  `CaptureBackend`, which emits each Dynamo FX graph as a `CompiledGraph`
  before calling the real backend.
- `torch.compile` is wrapped to count calls of what it returns.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch

from fuselens.capture import frames as fr
from fuselens.events import CompiledGraph, GraphNode, SourceLocation

Emit = Callable[[Any], None]


class MaxCallsReached(BaseException):
    """Raised out of user code to stop it once max_calls is reached. A
    BaseException so that the program's own `except Exception` lets it pass."""


def _compile_id() -> str:
    try:
        cid = torch._guards.CompileContext.current_compile_id()
    except AttributeError:
        return ""
    if cid is None or getattr(cid, "frame_id", None) is None:
        return str(cid or "")
    return f"{cid.frame_id}/{cid.frame_compile_id}"


def backend_name(backend: Any) -> str:
    """A readable name for a backend argument."""
    if isinstance(backend, str):
        return backend
    for attr in ("compiler_name", "__name__"):
        value = getattr(backend, attr, None)
        if isinstance(value, str):
            return value
    inner = getattr(backend, "compiler_fn", None)  # _TorchCompileWrapper
    if inner is not None and inner is not backend:
        return backend_name(inner)
    return type(backend).__name__


def _is_fuselens(backend: Any) -> bool:
    """Whether a backend argument is the fuselens compiler (by name, or the
    function itself, bare or inside torch.compile's wrapper), without
    importing the compiler."""
    fn = getattr(backend, "compiler_fn", backend)  # _TorchCompileWrapper
    if isinstance(fn, str):
        return fn == "fuselens"
    return getattr(fn, "__module__", None) == "fuselens.compiler.entry"


def _target_name(node: Any) -> str:
    target = node.target
    if node.op in ("call_method", "call_module", "get_attr", "placeholder", "output"):
        return str(target)
    try:
        from torch.fx.node import _get_qualified_name

        return _get_qualified_name(target)
    except Exception:
        return getattr(target, "__name__", str(target))


_DTYPE_SHORT = {
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.int64": "i64",
    "torch.int32": "i32",
    "torch.bool": "bool",
}


def _shape(node: Any) -> str:
    value = node.meta.get("example_value", node.meta.get("val"))
    if isinstance(value, torch.Tensor):
        dims = ", ".join(str(d) for d in value.shape)
        return f"[{dims}] {_DTYPE_SHORT.get(str(value.dtype), str(value.dtype).replace('torch.', ''))}"
    if isinstance(value, (int, float, bool, torch.SymInt)):
        return type(value).__name__ if isinstance(value, torch.SymInt) else repr(value)
    return ""


def graph_event(gm: Any, compile_id: str, backend: str, frame: Optional[tuple[str, int, str]], stage: str = "dynamo") -> CompiledGraph:
    """A CompiledGraph of an FX GraphModule, nodes located in user code."""
    nodes, ops = [], []
    for node in gm.graph.nodes:
        target = _target_name(node)
        if node.op.startswith("call_"):
            ops.append(target)
        nodes.append(
            GraphNode(
                name=node.name,
                op=node.op,
                target=target,
                inputs=[n.name for n in node.all_input_nodes],
                location=fr.innermost_user_in(node.meta.get("stack_trace")),
                shape=_shape(node),
            )
        )
    if frame is not None:
        file, line, name = frame
        location = fr.make_location(file, line, name)
    else:
        first = next((n.location for n in nodes if n.location), None)
        location = first or SourceLocation("<unknown>", 0)
    return CompiledGraph(
        compile_id=compile_id,
        function=location.function,
        location=location,
        backend=backend,
        stage=stage,  # type: ignore[arg-type]
        ops=ops,
        nodes=nodes,
        graph_id=f"{compile_id}:{stage}",
    )


class CaptureBackend:
    """Wraps a resolved backend: emit the graph, then compile it for real.

    No `__getattr__` delegation: Dynamo's C frame evaluator walks backend
    attributes and crashes (SIGSEGV, torch 2.13) on a delegating proxy, so
    only the attributes Dynamo reads are copied."""

    _COPIED = ("compiler_name", "get_compiler_config", "backend_ctx_ctor", "__name__")

    def __init__(self, inner: Callable[..., Any], name: str, capture: "Capture") -> None:
        self._inner = inner
        self._name = name
        self._capture = capture
        for attr in self._COPIED:
            if hasattr(inner, attr):
                try:
                    setattr(self, attr, getattr(inner, attr))
                except (AttributeError, TypeError):
                    pass

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        cid = _compile_id()
        capture = self._capture
        try:
            event = graph_event(gm, cid, self._name, capture.frame_for(cid))
            if capture.split_piece is not None:  # one piece of a DDP split (capture/ddp.py)
                event.graph_id += f":bucket{capture.split_piece}"
                capture.split_piece += 1
            capture.graphs[cid] = event
            capture.emit(event)
        except Exception as exc:  # a graph we cannot describe still compiles
            capture.note_internal(f"could not describe graph {cid}: {exc!r}")
        return self._inner(gm, example_inputs, **kwargs)


class Capture:
    """The patches, installed once per worker, configured per run."""

    def __init__(self, emit: Emit, frame_for: Callable[[str], Optional[tuple[str, int, str]]]) -> None:
        self.emit = emit
        self.frame_for = frame_for
        self.forced_backend: Optional[str] = None
        self.compiler_options: dict[str, Any] = {}  # this run's fuselens compiler options
        self.max_calls: Optional[int] = None
        self.calls: dict[int, int] = {}
        self.max_calls_reached = False
        self.on_before_call: Optional[Callable[[], None]] = None  # e.g. periodic sink flush
        self.internal_notes: list[str] = []
        self.graphs: dict[str, CompiledGraph] = {}  # compile id -> its Dynamo graph, this run
        # Set by capture/ddp.py while DDPOptimizer compiles the pieces of one
        # graph: the index of the next piece, which names its graph id.
        self.split_piece: Optional[int] = None
        self._orig_get_compiler_fn: Any = None
        self._orig_compile: Any = None

    def note_internal(self, message: str) -> None:
        self.internal_notes.append(message)

    def reset_run(self, forced_backend: Optional[str], max_calls: Optional[int],
                  compiler_options: Optional[dict[str, Any]] = None) -> None:
        self.forced_backend = forced_backend
        self.compiler_options = dict(compiler_options or {})
        self.max_calls = max_calls if max_calls and max_calls > 0 else None
        self.calls = {}
        self.max_calls_reached = False
        self.internal_notes = []
        self.graphs = {}

    def mark_kernels(self, compile_id: str, node_kernel: dict[str, str]) -> None:
        """Kernels of a graph are known: re-emit the graph with each node's
        kernel set (the parent keeps the last graph per graph_id)."""
        graph = self.graphs.get(compile_id)
        if graph is None:
            return
        for node in graph.nodes:
            node.kernel = node_kernel.get(node.name, node.kernel)
        self.emit(graph)

    # -- installation ------------------------------------------------------
    def install(self) -> None:
        import torch._dynamo.eval_frame as ef

        if self._orig_get_compiler_fn is None and hasattr(ef, "get_compiler_fn"):
            self._orig_get_compiler_fn = ef.get_compiler_fn
            ef.get_compiler_fn = self._get_compiler_fn  # type: ignore[assignment]
        if self._orig_compile is None:
            self._orig_compile = torch.compile
            torch.compile = self._compile  # type: ignore[assignment]

    def _get_compiler_fn(self, compiler_fn: Any) -> Any:
        if self.forced_backend is not None:
            compiler_fn = self.forced_backend
        name = backend_name(compiler_fn)
        if self.compiler_options and _is_fuselens(compiler_fn):
            compiler_fn = self._with_run_options(compiler_fn)
        resolved = self._orig_get_compiler_fn(compiler_fn)
        # Dynamo calls WrapBackendDebug, which calls `_torchdynamo_orig_backend`:
        # capture there, so every object Dynamo itself holds stays its own.
        inner = getattr(resolved, "_torchdynamo_orig_backend", None)
        if inner is not None and not isinstance(inner, CaptureBackend):
            resolved._torchdynamo_orig_backend = CaptureBackend(inner, name, self)
            return resolved
        return CaptureBackend(resolved, name, self)

    def _with_run_options(self, compiler_fn: Any) -> Any:
        """The fuselens backend called with this run's options. The program's
        own `torch.compile(options=...)` still win over them, as they win over
        `fuselens.compiler.configure()`."""
        from torch._dynamo.backends.registry import lookup_backend

        program = dict((getattr(compiler_fn, "kwargs", None) or {}).get("options") or {})
        bound = functools.partial(lookup_backend("fuselens"), options={**self.compiler_options, **program})
        bound.compiler_name = "fuselens"  # type: ignore[attr-defined]  (Dynamo's name for the backend)
        return bound

    def _compile(self, model: Any = None, *args: Any, **kwargs: Any) -> Any:
        if model is None:  # @torch.compile(backend=...) used as a decorator factory
            return lambda m: self._compile(m, *args, **kwargs)
        if self.forced_backend is not None and self.forced_backend != "inductor":
            # mode/options are Inductor's; another forced backend would reject them.
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
        compiled = self._orig_compile(model, *args, **kwargs)
        return self._count_calls(compiled)

    # -- call counting -------------------------------------------------------
    def _before_call(self, key: int) -> None:
        n = self.calls.get(key, 0)
        if self.max_calls is not None and n >= self.max_calls:
            self.max_calls_reached = True
            raise MaxCallsReached(f"a compiled function was about to run for the {n + 1}th time")
        self.calls[key] = n + 1
        if self.on_before_call is not None:
            self.on_before_call()

    def _count_calls(self, compiled: Any) -> Any:
        if isinstance(compiled, torch.nn.Module):
            key = id(compiled)

            def pre_hook(module: Any, args: Any) -> None:
                self._before_call(key)

            compiled.register_forward_pre_hook(pre_hook)
            return compiled
        if not callable(compiled):
            return compiled

        @functools.wraps(compiled)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._before_call(id(counted))
            return compiled(*args, **kwargs)

        return counted
