"""Python's garbage collector during a compile: the objects alive before it are not scanned.

A full collection walks every object the process holds: torch, transformers, the
model, Dynamo's trace (half a million objects for a BERT training step). A compile
makes objects fast enough (sympy expressions above all) that the collector runs full
passes during it: in BERT's training step (6 layers, CPU) three took 0.79 s of the
first call. Objects older than the compile are frozen for its duration (`gc.freeze`),
and only the youngest generation is collected during it: the compile's short-lived cycles
go every few hundred allocations, its longer-lived objects wait in the middle generation
for one pass after the compile, which promotes only what the compile left alive. After it
the old objects are collectable again, at the next full pass Python runs as it would have.
The compile's cycles that outlive a young pass wait for its end (ResNet-50 training on a
2-core CPU: no more peak host memory, 874 against 883 MB). Garbage not yet collected when
a compile starts is freed first (a pass over the two young generations): frozen, it would
land in the oldest generation at the compile's end and wait for a full pass.

The same holds for Dynamo's trace before the backend is called: GPT-2's training step
ran three full passes there (0.65 s of a 9 s first call on a 2-core CPU). A Dynamo
start callback freezes while a frame whose backend is ours is traced
(`freeze_while_dynamo_traces`); frames compiled for other backends (Inductor in the
same process) keep Python's collector as it is.

Held-back full passes leave one kind of garbage for long: a cycle that a compile made and
that became unreachable only after it, in the oldest generation by then. Dynamo makes such
cycles: a graph break's exception, kept in a frame of its trace, holds its traceback, whose
frames hold, through their callers, the frames of the step being compiled, whose locals are
the step's tensors. BART training on the H200 (a data-dependent branch) kept the first step's
785 MB of logits alive through every later step, since nothing made long-lived objects
fast enough for Python to run a full pass (Inductor's compiles do: it kept nothing). So
after compiles one full pass runs at the first call of a graph whose last call came after
the last compile (`collect_after_compiles`): the step that compiled has returned by then,
in a loop of steps. A graph called again while later graphs of the step still compile (BART's
mask graph, called for its encoder and its decoder) does not run it: a pass there came
before the step's last compiles, which asked for another. The pass costs what each of those
that the freeze holds back would have (0.4-0.7 s on the H200), once per run of compiles,
and where compiles keep coming, passes take at most a tenth of the program's time since its
first compile (`_PASS_SHARE`): a pass past that share is not run at all, and its compiles'
garbage waits for Python's own next full pass. Held back and asked for again at every call, it
ran once the program had run long enough, in its steady state: BART's training with CUDA
graphs on the H200 stalled a step for 0.52-0.56 s some hundred steps after its compiles (a
compile in its second step asked again right after the first pass), and before that a window
of ten times the last pass did the same (fifty-first and fifty-second sessions). None runs
while a CUDA graph is captured around the call.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
import time
from typing import Any, Callable, Iterator

_lock = threading.Lock()
_depth = 0  # compiles in progress (a backward compiled while its forward's compile runs)
_ours = False  # whether we froze: a program that froze objects itself keeps them frozen
_thresholds: tuple = ()  # the collector's thresholds before the compile
# Only the youngest generation is collected during a compile (every few hundred allocations:
# it frees the compile's short-lived cycles). Python runs a full pass once the objects that
# survived a middle-generation pass since the last full one reach a quarter of those it kept:
# the compile's survivors, promoted pass after pass, counted as new long-lived objects.
# Frozen alone, ResNet-50 training ran nine full passes during AOTAutograd's partition and
# our pipeline; with full passes held back, one came after the compile (0.4-0.7 s of the first
# call on the H200, a pass over every object of the process). Held in the middle generation,
# the compile's objects are scanned once after it by a middle-generation pass, which promotes
# only what the compile left alive.
_NEVER = 1 << 30  # passes of the younger generation before an older one is collected
_compiled = False  # a compile ended since the last full pass `collect_after_compiles` ran
_compiles = 0  # compiles ended so far (outermost ones)
# A program that compiles again and again (a new shape, a new function each call) spends at
# most one part in this many of its time since its first compile on our passes.
_PASS_SHARE = 10
_since: float = -1.0  # time.monotonic() at the first compile's start (-1: none yet)
_spent = 0.0  # seconds our passes took
_last = 0.0  # the last pass's seconds: what the next one is taken to cost


def _enter() -> None:
    global _depth, _ours, _thresholds, _since
    with _lock:
        if _since < 0:
            _since = time.monotonic()
        if _depth == 0 and gc.get_freeze_count() == 0:
            gc.collect(1)  # see the module's docstring: young garbage is not frozen
        _depth += 1
        if _depth == 1:
            _ours = gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
            _thresholds = gc.get_threshold()
            if len(_thresholds) == 3:
                gc.set_threshold(_thresholds[0], _NEVER, _NEVER)


def _exit() -> None:
    global _depth, _ours, _compiled, _compiles
    with _lock:
        _depth -= 1
        if _depth == 0:
            _compiled = True
            _compiles += 1
            if _ours:
                gc.unfreeze()
                _ours = False
            if _thresholds:
                gc.set_threshold(*_thresholds)


def collect_after_compiles(fn: Callable) -> Callable:
    """`fn`, a compiled graph's boxed callable, which, when a compile ended since the last
    such pass and none since its own last call, runs a full collection before the call (see
    the module's docstring)."""
    seen = -1  # compiles ended when its last call returned (-1: not called yet)

    def run(args: Any) -> Any:
        nonlocal seen
        if _compiled and seen == _compiles:
            _collect_garbage_of_compiles()
        try:
            return fn(args)
        finally:
            seen = _compiles

    return run


def _collect_garbage_of_compiles() -> None:
    global _compiled, _spent, _last
    import torch

    start = time.monotonic()
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return  # a CUDA graph being captured around the call: a later call collects
    with _lock:
        if _depth:  # a compile in progress: its end asks again
            return
        _compiled = False
    if _spent + _last > (start - _since) / _PASS_SHARE:
        return  # compiles keep coming: not now, nor later in the steady state (see the docstring)
    gc.collect()
    _last = time.monotonic() - start
    _spent += _last


@contextlib.contextmanager
def old_objects_frozen() -> Iterator[None]:
    _enter()
    try:
        yield
    finally:
        _exit()


def _backend_being_traced() -> Any:
    """The backend of the frame Dynamo is compiling, from its `_compile` frame's
    `compiler_fn` (torch 2.11-2.13), unwrapped to the function registered under its
    name; None where the stack does not show it."""
    frame = sys._getframe(1)
    for _ in range(40):
        if frame is None:
            return None
        if frame.f_code.co_name == "_compile" and "compiler_fn" in frame.f_code.co_varnames:
            fn = frame.f_locals.get("compiler_fn")
            for _ in range(10):  # Dynamo's debug and cache wrappers, torch.compile's, a partial
                inner = getattr(fn, "_torchdynamo_orig_backend", None) or getattr(fn, "compiler_fn", None) \
                    or getattr(fn, "func", None)
                if inner is None or inner is fn:
                    break
                fn = inner
            return fn
        frame = frame.f_back
    return None


_traced_frozen = False  # whether this Dynamo compile entered (start and end callbacks pair up)
_callbacks: Any = None  # (start, end) as registered: the same objects at every install


def freeze_while_dynamo_traces(handler: Any, is_ours: Callable[[Any], bool], hide: Callable) -> None:
    """Install, on Dynamo's callback handler, start and end callbacks that freeze the old
    objects while a frame whose backend `is_ours` is traced. Dynamo calls them once
    around its outermost compile (a nested one runs inside it). `hide` keeps Dynamo from
    tracing them (`torch._dynamo.disable`): a lazily compiled backward runs them under
    the frame hook of the step it resumes, and a trace of them would start a compile
    inside the handler's lock, which then waits for itself."""
    global _callbacks
    if not hasattr(handler, "register_end_callback"):
        return

    def start(args: Any) -> None:
        global _traced_frozen
        if str(getattr(getattr(args, "callback_trigger", None), "name", "")) != "DYNAMO":
            return
        try:
            ours = is_ours(_backend_being_traced())
        except Exception:  # noqa: BLE001 - a stack we do not know: the collector as it is
            ours = False
        if ours and not _traced_frozen:
            _traced_frozen = True
            _enter()

    def end(args: Any) -> None:
        global _traced_frozen
        if _traced_frozen:
            _traced_frozen = False
            _exit()

    if _callbacks is None:
        _callbacks = (hide(start), hide(end))
    if _callbacks[0] not in handler.start_callbacks:
        handler.register_start_callback(_callbacks[0])
        handler.register_end_callback(_callbacks[1])
