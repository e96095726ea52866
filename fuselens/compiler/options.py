"""Compiler options: one dataclass, a process-wide default, per-compile overrides.

    import fuselens.compiler as fc
    fc.configure(fusion=False)                 # process default, takes effect at the next compile
    torch.compile(f, backend="fuselens", options={"max_fusion_size": 8})   # this compile only

`current()` is the process default; `resolve(overrides)` merges a dict on top of it
and rejects unknown names with the list of valid ones. Options are read once per
compile, so changing them never needs a process restart (Dynamo's cache still holds
earlier compiles: call `torch._dynamo.reset()` to recompile old functions).

Each field says, in its metadata, how people set it: a short `label` and `help`,
and for the switches the TUI offers, the `choices` it cycles through (the first is
the default). The TUI's toggles, `--set NAME=VALUE` of `fuselens report`/`tui` and
the server's `fuselens.compilerOptions` setting are all read from here
(`parse_value`, `parse_assignment`, `validated`). Importing this module never
imports torch: the TUI and the language server import it.
"""

from __future__ import annotations

import dataclasses
import shlex
import threading
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional

Target = Literal["cpp", "triton", "auto"]
ModuleStateOnce = Literal["cpu", "always", "never"]


# What a graph that needs Triton reports where the optional dependency is missing.
TRITON_MISSING = ("the Triton target needs the triton package, which is not installed: "
                  "pip install 'fuselens[gpu]' (CPU tensors need none: target='cpp' or 'auto')")


def option(default: Any, label: str, help: str = "", choices: tuple[Any, ...] = (), auto: Any = None,
           minimum: Optional[int] = None, **kwargs: Any) -> Any:
    """A CompilerOptions field with how people set it: `label`/`help` for people,
    `choices` (first = default) makes it a TUI toggle, `auto` is the value that
    means "let the compiler choose", `minimum` bounds an int."""
    assert not choices or choices[0] == default, f"{label}: the first choice must be the default"
    meta = {"label": label, "help": help, "choices": tuple(choices), "auto": auto, "minimum": minimum}
    return field(default=default, metadata=meta, **kwargs)


@dataclass(frozen=True)
class CompilerOptions:
    """Everything the fuselens compiler can be told. Every field is documented
    because `fuselens report` quotes option names in its fusion explanations."""

    fusion: bool = option(True, "fusion", "fuse ops into kernels at all", choices=(True, False))
    """Fuse ops into kernels at all. False: one kernel per lowered op."""
    max_fusion_size: int = option(64, "max fusion size", "most nodes in one fused kernel",
                                  choices=(64, 32, 16, 8, 4, 2), minimum=1)
    """Most nodes in one fused kernel: the ops the scheduler places, not those a node
    recomputes inside it (Inductor counts the same way, and uses 64 too)."""
    reduction_fusion: bool = option(True, "reduction fusion", "fuse pointwise producers into reductions",
                                    choices=(True, False))
    """Fuse pointwise producers into reductions (prologue) and several reductions
    over the same rows into one pass (layernorm mean+var, softmax max+sum)."""
    epilogue_fusion: bool = option(True, "epilogue fusion", "fuse pointwise consumers after a reduction",
                                   choices=(True, False))
    """Fuse pointwise consumers after a reduction into the reduction's kernel."""
    horizontal_fusion: bool = option(True, "horizontal fusion",
                                     "fuse independent work over the same iteration space", choices=(True, False))
    """Fuse independent work over the same iteration space (no shared buffer)."""
    combo_kernels: bool = option(True, "combo kernels",
                                 "Triton: an optimizer step's independent kernels (its parameters) in one launch",
                                 choices=(True, False))
    """Triton: join consecutive independent pointwise kernels of a compiled optimizer
    step's graph (list ops, `_foreach_*`, or its for-loop implementation) in one launch,
    each keeping its own loop over its elements; see compiler/combo_kernels.py."""
    extern_epilogue_fusion: bool = option(
        True, "matmul epilogue", "GPU inference: bias+ReLU/GELU in cuBLASLt, batch norm+ReLU in cuDNN's conv",
        choices=(True, False))
    """Run pointwise epilogues inside the library call of a matmul/convolution where the
    library has one: on the Triton target, in inference, bias+ReLU/tanh-GELU after a
    Linear (cuBLASLt) and batch norm (folded into the weights)+bias+residual+ReLU after
    a conv2d (cuDNN); see compiler/library_epilogues.py. The C++ target has no matmul
    template: there the epilogue is its own kernel (the fusion events say so)."""
    module_state_once: ModuleStateOnce = option(
        "cpu", "module state once", "inference: work on parameters and buffers alone done once, redone when "
        "they change (cpu: on CPU tensors)", choices=("cpu", "always", "never"))
    """In an inference graph, compute what depends on parameters and buffers alone (a
    convolution weight made channels-last, a batch norm folded into its convolution's
    weight) once, and again only when one of them changes (moved, or updated in place);
    see compiler/module_state_prologue.py. The results stay allocated between calls: on
    CPU tensors by default, where they save most (ResNet-50 inference on a 2-core CPU:
    60 to 44 ms a call, oneDNN's weight reorders and the batch norms' scales); "always"
    on CUDA tensors too (ResNet-50 bf16 inference on the H200: 6% faster, 22 MB more at
    its peak, above Inductor's); never with `cuda_graphs`, whose replays would not see
    a result redone."""
    target: Target = option("auto", "target", "generated code: C++/OpenMP or Triton (auto: cpp on CPU tensors)",
                            choices=("auto", "cpp", "triton"))
    """Code generator: "cpp" (C++/OpenMP), "triton", or "auto" (cpp on CPU tensors)."""
    vector_width: int = option(0, "vector width", "SIMD lanes hinted to the C++ compiler (0: g++ chooses)",
                               auto=0)
    """SIMD lanes hinted to the C++ compiler (`#pragma omp simd simdlen(N)`); 0 lets
    g++ choose from -march=native."""
    threads: int = option(0, "threads", "OpenMP threads per kernel", choices=(0, 1, 2, 4, 8), auto=0)
    """OpenMP threads per kernel; 0 follows torch.get_num_threads()."""
    time_kernels: bool = option(False, "time kernels", "time every kernel call")
    """Time every kernel call; totals stream as KernelTiming events on sink.flush()."""
    # -- Triton target (issue 5; fuselens/compiler/runtime/) --
    autotune: bool = option(False, "autotune", "Triton: time a few launch configurations per kernel and keep the fastest",
                            choices=(False, True))
    """Triton: time a few launch configurations per kernel and size class at the
    first launch and keep the fastest (cached on disk under cache_dir); off: the
    launch heuristics decide."""
    cuda_graphs: bool = option(False, "CUDA graphs", "Triton on CUDA: replay the whole compiled graph as one CUDA graph",
                               choices=(False, True))
    """Triton on CUDA: capture the whole compiled graph as one CUDA graph and replay
    it; inputs are copied into static buffers first (reported as the kernel
    `cudagraph_input_copies`), and outputs are overwritten by the next call. A graph
    a replay could not repeat (a CPU tensor, a value read on the host, a size set by
    the data) runs with plain launches, with a finding that says why and where."""
    compile_workers: int = option(-1, "compile workers", "Triton on CUDA: kernel compile processes (-1: auto)",
                                  auto=-1)
    """Triton on CUDA: processes that compile a graph's kernels in parallel, in the
    background, each kernel's first launch waiting for its own (compile_pool.py).
    -1 picks all CPUs but two, at most 16, split among torchrun's ranks on one host
    (none below a share of 4 CPUs); 0 compiles in
    threads of this process before the first call. The workers start as Dynamo
    begins tracing in a process whose CUDA is initialized (0 set process-wide with
    `configure` keeps them off), at the latest as a CUDA graph enters the backend;
    they import Triton alone (under a second); a graph compiled before they are up
    compiles in threads."""
    backward_with_forward: bool = option(True, "backward with forward",
                                         "Triton on CUDA: compile a training graph's backward with its forward",
                                         choices=(True, False))
    """Triton on CUDA: compile a training graph's backward right after its forward,
    before the forward first runs, instead of at the first backward call (AOTAutograd's
    default, Inductor's too). The forward's kernels compile in the workers while the
    backward's passes run, and the backward's while the forward runs: the first step no
    longer waits for each graph's kernels in turn. Off for a graph whose backward may
    never run (an evaluation that forgot `torch.no_grad()`), whose compile it would add."""
    fallback_random: bool = option(False, "fallback random",
                                   "random ops (dropout) in ATen: eager's numbers, one kernel each",
                                   choices=(False, True))
    """Random ops (dropout, rand_like, randn_like, bernoulli) run in ATen with eager's
    generator: the same numbers as eager for the same seed, a kernel of their own each.
    Off: drawn inside the fused kernels that read them (Philox, seeded from torch's
    generator at every call: `torch.manual_seed` repeats a run, but the numbers are not
    eager's), as Inductor does unless its `fallback_random` is set. See
    compiler/random_ops.py."""
    lower: bool = option(True, "lower", "lower ATen ops to our IR (off: every op runs through ATen)")
    """Lower ATen ops to our IR. False: every op runs through ATen (debugging aid)."""
    fallback_on_error: bool = option(True, "fallback on error", "on a compile error run the graph eagerly")
    """On a compile error run the graph eagerly (and report it) instead of raising."""
    cache_dir: Optional[str] = option(None, "cache dir", "where compiled libraries are cached")
    """Where compiled libraries are cached; default $FUSELENS_CACHE_DIR, $XDG_CACHE_HOME/fuselens or
    ~/.cache/fuselens. It must be yours alone: fuselens refuses a folder another account can write."""
    parallel_threshold: int = option(32768, "parallel threshold", "smaller kernels run single-threaded")
    """Kernels with fewer elements than this run single-threaded (OpenMP start-up
    costs more than it saves)."""
    cxx: str = option("g++", "C++ compiler", "the C++ compiler")
    """The C++ compiler."""
    extra_cflags: tuple[str, ...] = option((), "extra cflags", "extra flags for the C++ compiler")
    """Extra flags appended to the g++ command line."""
    source_hook: Optional[Callable[[str, str], str]] = option(None, "source hook", "test hook (Python API only)",
                                                              compare=False)
    """Test hook: called as hook(kernel_name, source) -> source before compiling; lets
    tests inject a broken kernel to exercise the compile-error path."""

    def with_(self, **overrides: Any) -> "CompilerOptions":
        """A copy with `overrides` applied (validated)."""
        return _apply(self, overrides)

    def resolved_cache_dir(self) -> str:
        """The cache folder, created 0700 and checked to be this user's alone
        (raises private_dirs.UnsafePathError otherwise)."""
        from fuselens.private_dirs import cache_root, private_dir

        return private_dir(self.cache_dir or cache_root())

    def resolved_threads(self) -> int:
        if self.threads > 0:
            return self.threads
        import torch

        return max(1, torch.get_num_threads())


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CompilerOptions))
FIELDS = {f.name: f for f in dataclasses.fields(CompilerOptions)}
# Resolved annotations (this module uses `from __future__ import annotations`).
_TYPES = typing.get_type_hints(CompilerOptions)

_lock = threading.Lock()
_current = CompilerOptions()


class UnknownOptionError(ValueError):
    """An option name that CompilerOptions does not have."""


class OptionValueError(ValueError):
    """A value an option cannot take."""


def _unknown(names: list[str]) -> UnknownOptionError:
    return UnknownOptionError(
        f"unknown fuselens compiler option(s) {', '.join(map(repr, names))}; "
        f"valid options: {', '.join(OPTION_NAMES)}"
    )


def _check(name: str, value: Any) -> None:
    """The checks every way of setting an option goes through."""
    kind = _TYPES[name]
    if typing.get_origin(kind) is Literal and value not in typing.get_args(kind):
        allowed = ", ".join(map(repr, typing.get_args(kind)))
        raise OptionValueError(f"option {name} must be one of {allowed}, not {value!r}")
    minimum = FIELDS[name].metadata["minimum"]
    if minimum is not None and int(value) < minimum:
        raise OptionValueError(f"option {name} must be >= {minimum}")


def _apply(base: CompilerOptions, overrides: dict[str, Any]) -> CompilerOptions:
    unknown = sorted(k for k in overrides if k not in OPTION_NAMES)
    if unknown:
        raise _unknown(unknown)
    for name, value in overrides.items():
        _check(name, value)
    if "extra_cflags" in overrides:
        overrides = dict(overrides, extra_cflags=tuple(overrides["extra_cflags"]))
    return dataclasses.replace(base, **overrides)


_TRUE = ("on", "true", "yes", "1")
_FALSE = ("off", "false", "no", "0")


def parse_value(name: str, value: Any) -> Any:
    """`value` for option `name` as a person typed it (text: `on`, `8`, `auto`,
    `-O3 -ffast-math`) or as JSON sent it, converted to the field's type and
    checked; raises UnknownOptionError or OptionValueError with a message
    that names the option."""
    if name not in FIELDS:
        raise _unknown([name])
    kind, meta = _TYPES[name], FIELDS[name].metadata
    optional = type(None) in typing.get_args(kind)
    if optional:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    bad = OptionValueError(f"option {name}: {value!r} is not {_describe(kind, optional)}")
    if isinstance(value, str) and value.lower() == "auto" and meta["auto"] is not None:
        value = meta["auto"]
    if optional and (value is None or value in ("", "none")):
        value = None
    elif kind is bool:
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            value = value.lower() in _TRUE
        elif not isinstance(value, bool):
            raise bad
    elif kind is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise bad from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
    elif typing.get_origin(kind) is tuple:
        value = tuple(shlex.split(value)) if isinstance(value, str) else value
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise bad
        value = tuple(value)
    elif kind is str or typing.get_origin(kind) is Literal:
        if not isinstance(value, str):
            raise bad
    else:  # a callable: only the Python API can pass one
        raise OptionValueError(f"option {name} can only be set from Python (fuselens.compiler.configure)")
    _check(name, value)
    return value


def _describe(kind: Any, optional: bool) -> str:
    if kind is bool:
        text = "on/off"
    elif kind is int:
        text = "an integer"
    elif typing.get_origin(kind) is Literal:
        text = "one of " + ", ".join(typing.get_args(kind))
    elif typing.get_origin(kind) is tuple:
        text = "a list of strings"
    else:
        text = "a string"
    return text + (" or none" if optional else "")


def parse_assignment(text: str) -> tuple[str, Any]:
    """`NAME=VALUE` (the `--set` of `fuselens report` and `fuselens tui`) ->
    (name, typed value); raises ValueError with a message for a person."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise OptionValueError(f"{text!r}: expected NAME=VALUE, e.g. max_fusion_size=8")
    name = name.strip()
    return name, parse_value(name, value.strip())


def validated(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every entry of `overrides` (e.g. a JSON setting) parsed by `parse_value`;
    raises on the first bad one."""
    if not isinstance(overrides, Mapping):
        raise OptionValueError(f"compiler options must be an object of NAME: VALUE, not {overrides!r}")
    return {name: parse_value(name, value) for name, value in overrides.items()}


def toggle_fields() -> tuple[dataclasses.Field, ...]:
    """The options the TUI offers as toggles: those with `choices`, in field order."""
    return tuple(f for f in dataclasses.fields(CompilerOptions) if f.metadata["choices"])


def current() -> CompilerOptions:
    """The process-wide default options."""
    return _current


def configure(**overrides: Any) -> CompilerOptions:
    """Change the process-wide default (validated); returns the new options."""
    global _current
    with _lock:
        _current = _apply(_current, overrides)
        return _current


def reset() -> CompilerOptions:
    """Back to the built-in defaults."""
    global _current
    with _lock:
        _current = CompilerOptions()
        return _current


def resolve(overrides: Optional[dict[str, Any]] = None) -> CompilerOptions:
    """The options for one compile: the process default plus `overrides`."""
    return _apply(current(), dict(overrides or {}))
