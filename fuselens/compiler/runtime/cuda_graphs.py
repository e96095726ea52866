"""CUDA graphs for compiled Triton graphs (option `cuda_graphs`, CUDA only).

The first call per input signature runs normally (compiling and tuning kernels)
and captures one CUDA graph; later calls copy the inputs into the graph's static
buffers and replay it. The copies are a kernel of their own in the report
(`cudagraph_input_copies`); parameters, buffers and the outputs other graphs replay
into (a model's logits handed to its loss after a graph break) are not copied: their
address is stable, and one that moves re-captures. Outputs live in the graph's memory pool and are
overwritten by the next replay, as with Inductor's CUDA graphs.

A backward's parameter gradients are handed out as fresh tensors on that memory,
so that autograd's AccumulateGrad takes them as `.grad` instead of cloning each
(it clones a gradient another reference holds: 57-161 copies a step in the models
of benchmarks.models, 0.25-0.5 ms). A `.grad` still holding one when its graph replays
again (gradient accumulation) is first moved out of the pool: its storage gets a
copy of the values, the graph keeps the pool memory.

`torch._dynamo.reset()` drops every captured graph (through the backend's `reset`), with
the parameters and pools it held, as it resets Inductor's CUDA graph trees.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, NamedTuple, Optional, Sequence

import torch

from fuselens.kernel_timing import KernelTimer


# Captures again, of one input signature, because an input read in place moved, after which
# that graph copies its inputs instead: each capture is a warm-up run, and graphs that feed
# each other would otherwise capture on every call. Before this limit, borrowing stopped at the
# first move: GPT-2's training backward then copied its 79 saved activations (846 MB) into
# static buffers on every replay (0.92x of reduce-overhead, twice its peak memory).
MOVES_BEFORE_COPYING = 4


class _Hit(NamedTuple):
    """A captured signature and what a replay of it needs, looked up once."""

    key: tuple  # the input signature
    entry: tuple  # (static inputs, positions read in place, graph, outputs)
    plan: tuple  # (positions copied or compared, positions read in place, addresses)
    handed: Optional[list]  # the gradients handed out from its outputs


class CudaGraphRunner:
    """Replays a captured CUDA graph of a compiled graph ."""

    _boxed_call = True
    # runners alive now: an input that is another graph's replayed output (a model's
    # logits handed to its loss after a graph break) keeps its address from call to call
    # like a parameter, so it is read in place instead of copied (GPT-2: 0.5 ms a step)
    _live: "weakref.WeakSet[CudaGraphRunner]" = weakref.WeakSet()
    _captures = 0  # bumped by every capture: what `_replayed` caches is valid until the next

    def __init__(self, runner: Any, graph_id: str, timer: Optional[KernelTimer], static_inputs: Optional[set[int]] = None,
                 mutated_inputs: Sequence[int] = (), gradient_outputs: Sequence[int] = ()) -> None:
        self.runner = runner
        # outputs that are parameters' gradients (a backward's): handed out as fresh tensors
        self.gradient_outputs = sorted(gradient_outputs) if _CAN_COUNT_REFERENCES else []
        self.handed: dict[tuple, list] = {}  # signature -> [(output, its storage, references we hold)]
        # inputs the graph overwrites: a copied one is copied back after each replay, and a
        # static one must not be overwritten by the warm-up before capture as well
        self.mutated_inputs = list(mutated_inputs)
        self.graph_id = graph_id
        # replayed in place, like Parameters; a moved one is captured again (see __call__)
        self.static_inputs = set(static_inputs or ())
        # the graph's timer (option time_kernels): a replay is timed whole, and the input copies
        # before it, not the kernels inside it
        self.timer = timer
        self.graphs: dict[tuple, Any] = {}
        self.reported = False
        self.outputs: set[int] = set()  # storages of the captured graphs' outputs
        self.borrow = True  # may read other graphs' replayed outputs in place
        self.borrowed: set[tuple] = set()  # input signatures captured reading one
        self.moves: dict[tuple, int] = {}  # signature -> captures since an input it read in place moved
        self._replayed_at: Optional[tuple] = None  # (captures, live runners) `_replayed_cache` is of
        self._replayed_cache: set[int] = set()
        # the last replay's signature with what a replay needs of it: a signature is a tuple of a
        # tuple per input, which Python hashes anew at every lookup (ResNet-50's 321 inputs: three
        # lookups a replay were 40-60 us of its host time)
        self._last_hit: Optional[_Hit] = None
        self._plans: dict[tuple, tuple] = {}  # signature -> (positions copied or compared, positions read in place)
        self.failed = ""  # why a capture failed: from then on the graph runs with plain launches
        self.captures_made = 0  # replaced ones included: each replaced one left its pool to the allocator's cache
        CudaGraphRunner._live.add(self)

    @staticmethod
    def _key(args: Sequence[Any]) -> tuple:
        return tuple((tuple(a.shape), tuple(a.stride()), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("v", a)
                     for a in args)

    def __call__(self, args: list) -> Any:
        if self.failed:
            return self.runner(args)
        hit = self._last_hit
        if hit is not None and self._same_call(hit, args):
            return self._replay(hit, args)
        del hit  # it holds the last graph's outputs, which a capture below must not keep alive
        key = self._key(args)
        ent = self.graphs.get(key)
        if ent is not None:
            static, params = ent[0], ent[1]  # not its outputs: a capture below must not keep them alive
            if any(args[i].data_ptr() != static[i].data_ptr() for i in params):
                ent = None  # a parameter moved: capture again
                if key in self.borrowed:
                    # an input read in place moved: its graph captured again. While a training
                    # step warms up, each graph upstream captures again once it reads its own
                    # upstream's outputs in place (GPT-2: the loss's backward, then the model's);
                    # two graphs feeding each other would move each other's on every call
                    self.moves[key] = self.moves.get(key, 0) + 1
                    self.borrow &= self.moves[key] <= MOVES_BEFORE_COPYING
            elif self._copies_a_replayed_output(args, params):
                ent = None  # an input is now another graph's replayed output: captured again to read it in place
        if ent is None:
            return self._warm_up_and_capture(key, args)
        return self._replay(self._remember(key), args)

    def _warm_up_and_capture(self, key: tuple, args: list) -> Any:
        """Capture (after one warm-up run that compiles and tunes the kernels) and
        replay for this call's result. Neither the warm-up's outputs nor a graph captured
        before for this signature are alive during the capture: a training forward's
        saved activations would be held twice (GPT-2: 6.1 GB at its peak against 3.3 GB
        for reduce-overhead)."""
        self._forget(key)
        inputs = list(args)
        args.clear()
        try:
            self.graphs[key] = self._capture(key, inputs)
        except Exception as e:  # noqa: BLE001 - CUDA refused the capture: the graph runs as compiled
            self._plans.pop(key, None)
            self.handed.pop(key, None)
            self.failed = f"{type(e).__name__}: {str(e)[:300]}"
            _report_failed_capture(self.graph_id, self.failed)
            return self.runner(inputs)
        return self._replay(self._remember(key), inputs)

    def _remember(self, key: tuple) -> _Hit:
        """Make `key` the last replayed signature; returns what a replay of it needs."""
        self._last_hit = _Hit(key, self.graphs[key], self._plans[key], self.handed.get(key))
        return self._last_hit

    def _forget(self, key: tuple) -> None:
        """Drop the graph of `key` (its outputs and pool go once nobody else holds them)."""
        if self.graphs.pop(key, None) is None:
            return
        self.handed.pop(key, None)
        self._plans.pop(key, None)
        if self._last_hit is not None and self._last_hit.key == key:
            self._last_hit = None
        self.outputs = {o.untyped_storage().data_ptr() for ent in self.graphs.values() for o in ent[3]
                        if isinstance(o, torch.Tensor)}
        CudaGraphRunner._captures += 1  # other runners' `_replayed` caches hold the old outputs

    def release(self) -> None:
        """Drop every captured graph: its static inputs (a model's parameters among them),
        its outputs and, once nobody else holds those, its memory pool. A later call
        captures again."""
        for key in list(self.graphs):
            self._forget(key)
        self.moves.clear()
        self.borrowed.clear()

    def _same_call(self, hit: _Hit, args: list) -> bool:
        """Whether `args` replay the graph the last call replayed: the other inputs of the
        same sizes and strides (scalars equal), the ones read in place at the same address,
        none another graph's replayed output. The slow path's checks, without building a
        signature of every input (ResNet-50's backward has 320: 1.7 ms a step)."""
        _, (static, params, _, _), (others, in_place, ptrs), _ = hit
        if len(args) != len(static):
            return False
        for i in others:
            a, s = args[i], static[i]
            if isinstance(s, torch.Tensor):
                if not (isinstance(a, torch.Tensor) and a.shape == s.shape and a.stride() == s.stride()
                        and a.dtype == s.dtype):
                    return False
            elif isinstance(a, torch.Tensor) or a != s:
                return False
        if ptrs is not None:
            if not _PTRS_EQUAL(args, ptrs, in_place):
                return False
        elif any(args[i].data_ptr() != static[i].data_ptr() for i in in_place):
            return False
        return not self._copies_a_replayed_output(args, params, others)

    def _replay(self, hit: _Hit, args: list) -> Any:
        key, (static, params, graph, outs), (copied, _, _), handed = hit
        if handed and not self._move_out_held_gradients(outs, handed):
            # a held gradient this torch cannot move out: a new graph writes other memory,
            # and gradients are handed out as before (autograd copies them)
            self.gradient_outputs = []
            self.handed.clear()
            return self._warm_up_and_capture(key, args)
        timer = self.timer
        t0 = timer.start() if timer is not None else None
        tensors = [i for i in copied if isinstance(args[i], torch.Tensor)]
        _copy_all([static[i] for i in tensors], [args[i] for i in tensors])
        if timer is not None:
            timer.stop("cudagraph_input_copies", t0)
        back = [(args[i], static[i]) for i in self.mutated_inputs if i not in params]
        args.clear()
        t1 = timer.start() if timer is not None else None
        graph.replay()
        if timer is not None:
            timer.stop("cudagraph_replay", t1)
        _copy_all([a for a, _ in back], [s for _, s in back])
        if not handed:
            return list(outs)
        result = list(outs)
        for i, _, _ in handed:
            result[i] = outs[i].detach()  # a tensor only autograd holds: AccumulateGrad keeps it as .grad
        return result

    def _move_out_held_gradients(self, outs: list, handed: list) -> bool:
        """A gradient handed out by the last replay and still held (a `.grad` being
        accumulated into) would be overwritten by this one: its storage takes a copy of
        the values, and the graph's output a new storage on the pool memory. False when
        one is held and this torch cannot move a storage's memory."""
        for k, (i, st, refs) in enumerate(handed):
            if torch._C._storage_Use_Count(st._cdata) <= refs:
                continue
            if not _CAN_MOVE_STORAGE:
                return False
            o = outs[i]
            fresh = st.clone()
            st._swap_data_ptr_(fresh)  # the holders now see the copy; `fresh` owns the pool memory
            outs[i] = torch.empty(0, dtype=o.dtype, device=o.device).set_(fresh, o.storage_offset(), o.size(),
                                                                          o.stride())
            handed[k] = (i, fresh, torch._C._storage_Use_Count(fresh._cdata))
        return True

    def _capture(self, key: tuple, inputs: list) -> tuple:
        static, params = [], set()
        nbytes = 0
        replayed = self._replayed()
        for i, a in enumerate(inputs):
            borrowed = isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in replayed
            if borrowed:
                self.borrowed.add(key)
            if isinstance(a, torch.Tensor) and (isinstance(a, torch.nn.Parameter) or i in self.static_inputs
                                                or borrowed):
                static.append(a)
                params.add(i)
            elif isinstance(a, torch.Tensor):
                s = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                s.copy_(a)
                static.append(s)
                nbytes += a.untyped_storage().nbytes()
            else:
                static.append(a)
        graph = torch.cuda.CUDAGraph()
        device = torch.cuda.current_device()
        side = _warm_up_stream(device)
        side.wait_stream(torch.cuda.current_stream())
        kept = [(static[i], static[i].clone()) for i in self.mutated_inputs if i in params]
        pool = _GraphPool(device)
        try:
            # the warm-up, on the capture's stream and in its pool: the memory it frees is what
            # the capture allocates again, as reduce-overhead's warm-ups do (H200, GPT-2 training
            # alone in a process: 3096 -> 3030 MB reserved; reduce-overhead 2770)
            with torch.cuda.stream(side), pool.allocating():
                self.runner(list(static))  # its outputs die here
                for t, before in kept:  # the replay after the capture applies this call's update; the warm-up's is undone
                    t.copy_(before)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph, pool=pool.handle, stream=side):
                outs = list(self.runner(list(static)))
        finally:
            pool.release()  # the graph holds the pool from here on; a failed capture leaves it freeable
        self.outputs |= {o.untyped_storage().data_ptr() for o in outs if isinstance(o, torch.Tensor)}
        self.captures_made += 1
        self.handed[key] = self._handed_out(outs)
        tensors = all(isinstance(a, torch.Tensor) for a in static)
        ptrs = [a.data_ptr() for a in static] if _PTRS_EQUAL is not None and tensors else None
        self._plans[key] = ([i for i in range(len(static)) if i not in params], sorted(params), ptrs)
        CudaGraphRunner._captures += 1
        if not self.reported:
            self._report(len(inputs) - len(params), nbytes)
        return static, params, graph, outs

    def _handed_out(self, outs: Sequence[Any]) -> list:
        """(position, storage, references we hold to it) of each gradient output with a
        storage of its own (one shared with another output is handed out as before)."""
        outs = list(outs)
        cdata = [o.untyped_storage()._cdata if isinstance(o, torch.Tensor) else None for o in outs]
        handed = []
        for i in self.gradient_outputs:
            if i < len(outs) and isinstance(outs[i], torch.Tensor) and cdata.count(cdata[i]) == 1:
                st = outs[i].untyped_storage()
                handed.append((i, st, torch._C._storage_Use_Count(st._cdata)))
        return handed

    def copied_inputs(self) -> list[tuple[int, tuple, str]]:
        """(position, shape, dtype) of each input a replay copies, over this runner's
        captures (what keeps a graph from reading its inputs in place)."""
        out = []
        for static, params, _, _ in self.graphs.values():
            out += [(i, tuple(a.shape), str(a.dtype).replace("torch.", "")) for i, a in enumerate(static)
                    if isinstance(a, torch.Tensor) and i not in params]
        return out

    def _copies_a_replayed_output(self, args: Sequence[Any], params: set[int],
                                  positions: Optional[Sequence[int]] = None) -> bool:
        replayed = self._replayed()
        if not replayed:
            return False
        positions = [i for i in range(len(args)) if i not in params] if positions is None else positions
        return any(isinstance(args[i], torch.Tensor) and args[i].untyped_storage().data_ptr() in replayed
                   for i in positions)

    def _replayed(self) -> set[int]:
        """Storages of the outputs other live graphs replay into (none once borrowing stopped)."""
        if not self.borrow:
            return set()
        # asked on every replay: rebuilt only when a graph was captured or a runner went away
        at = (CudaGraphRunner._captures, len(CudaGraphRunner._live))
        if at != self._replayed_at:
            self._replayed_cache = {p for r in CudaGraphRunner._live if r is not self for p in r.outputs}
            self._replayed_at = at
        return self._replayed_cache

    def _report(self, n: int, nbytes: int) -> None:
        from fuselens import sink
        from fuselens.events import Kernel

        self.reported = True
        sink.emit(Kernel(name="cudagraph_input_copies", kind="extern", graph_id=self.graph_id, ops=["aten.copy_"],
                         source=f"copy_ of {n} graph inputs ({nbytes} bytes) into the CUDA graph's static buffers "
                                "before each replay (parameters and buffers are replayed in place)",
                         language="", bytes_accessed=2 * nbytes, device="cuda"))
        # the replay's time is the graph's kernels' together: a Kernel of its own, so the
        # report and the TUI show it (the kernels inside a replay are not timed one by one)
        sink.emit(Kernel(name="cudagraph_replay", kind="extern", graph_id=self.graph_id, ops=["cudaGraphLaunch"],
                         source="one replay of the captured CUDA graph: every kernel and library call of "
                                "this graph in one launch", language="", device="cuda"))


def _report_failed_capture(graph_id: str, error: str) -> None:
    """A finding for a capture CUDA refused (what runtime/capture_check.py did not foresee)."""
    from fuselens import sink
    from fuselens.events import ErrorEntry

    sink.emit(ErrorEntry(kind="fallback", message=f"graph {graph_id} runs without CUDA graphs: its capture failed "
                         f"({error})"))


class _GraphPool:
    """The private memory pool one graph is captured into, with the warm-up before the capture
    allocating from it too, as Inductor's CUDA graph trees do. Held (`allocating` to
    `release`) from the warm-up until the capture holds it. Without torch's pool calls
    (`_cuda_beginAllocateCurrentThreadToPool` and kin), the capture makes its own pool and the
    warm-up allocates as usual."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.handle = torch.cuda.graph_pool_handle() if _POOL_CALLS else None
        self.held = False

    @contextlib.contextmanager
    def allocating(self) -> Iterator[None]:
        if self.handle is None:
            yield
            return
        torch._C._cuda_beginAllocateCurrentThreadToPool(self.device, self.handle)
        self.held = True
        try:
            yield
        finally:
            torch._C._cuda_endAllocateToPool(self.device, self.handle)

    def release(self) -> None:
        if self.held:
            torch._C._cuda_releasePool(self.device, self.handle)
            self.held = False


_POOL_CALLS = all(hasattr(torch._C, n) for n in ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool",
                                                  "_cuda_releasePool"))
_warm_up_streams: dict[int, Any] = {}


def _warm_up_stream(device: int) -> Any:
    """The one stream per device that warm-ups and captures run on. cuBLAS keeps a workspace
    per stream for the life of the process: a new stream per capture held 33 MB more each
    time (GPT-2 training: three graphs, 97 MB after the model was gone)."""
    stream = _warm_up_streams.get(device)
    if stream is None:
        stream = _warm_up_streams[device] = torch.cuda.Stream(device)
    return stream


def _copy_all(dsts: list, srcs: list) -> None:
    """`dst.copy_(src)` for each pair, as few launches as torch's multi-tensor copy makes
    (Inductor's CUDA graphs copy their inputs so): a compiled optimizer step copies every
    gradient (Dynamo marks parameters and state static, not gradients), 76 launches a
    step for GPT-2's, 161 for ResNet-50's."""
    if len(dsts) > 1:
        torch._foreach_copy_(dsts, srcs)
    elif dsts:
        dsts[0].copy_(srcs[0])


def release_all() -> None:
    """Every live runner's graphs dropped: `torch._dynamo.reset()` (through the backend's
    `reset`), as it resets Inductor's CUDA graph trees. Dynamo's reset leaves the
    compiled functions it installed in user modules' globals, and a runner holds its
    static inputs: a model compiled with `cuda_graphs` kept its parameters and pools
    alive after it was gone (GPT-2 training: 2.5 GB)."""
    for runner in list(CudaGraphRunner._live):
        runner.release()


# one C++ call comparing the addresses of many inputs (CUDA builds; Inductor's CUDA graphs use it)
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_CAN_COUNT_REFERENCES = hasattr(torch._C, "_storage_Use_Count")
# torch 2.13 moves a held gradient out of the pool; torch 2.11 has no way to, and captures again
_CAN_MOVE_STORAGE = hasattr(torch.UntypedStorage, "_swap_data_ptr_")


def _forward_static_indices() -> set[int]:
    try:
        from torch._guards import TracingContext

        ctx = TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
        return set(getattr(meta, "static_input_indices", None) or ())
    except (ImportError, AttributeError):  # pragma: no cover - other torch versions
        return set()


def gradient_output_indices() -> set[int]:
    """For a backward being compiled: its outputs that are gradients of parameters or
    buffers. AOTAutograd's backward returns one gradient per forward input, and the
    tracing context still holds the forward's metadata, whose static inputs are those."""
    return _forward_static_indices()


def static_input_indices(backward: bool = False) -> set[int]:
    """Inputs of the graph being compiled that AOTAutograd knows keep their address
    from call to call: parameters and buffers (a BatchNorm's running statistics are
    buffers, not Parameters). Empty outside a compile, and for a backward: while it
    compiles, the tracing context still holds its forward's metadata, whose indices are
    the forward's inputs. Taken for the backward's, they made ResNet-50's output
    gradient (a new tensor every step) "static": a capture on every step, 0.13x of
    reduce-overhead. A backward's saved activations are read in place by borrowing."""
    return set() if backward else _forward_static_indices()
