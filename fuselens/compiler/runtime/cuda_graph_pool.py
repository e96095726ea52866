"""One memory pool shared by the CUDA graphs of a step (option `cuda_graphs`).

A training forward's graph returns the activations its backward reads. With a pool per
graph, the forward's pool kept them between steps and the backward's temporaries and
gradients came on top (0.5-1.2 GB over `reduce-overhead` on the suite's models). Here a
graph captured while it reads another graph's outputs in place joins that graph's
family, one pool: a backward's capture reuses, for its temporaries and gradients, the
memory of each saved activation once it has read it, as Inductor's CUDA graph trees do.
A graph that reads no open family's output joins the family the device's last warm-up or
capture allocated in, while no capture is closed to it: a step's graphs, eager code between
them, share one pool, and the second step's captures reuse what the first step's warm-ups
let go (`GraphFamily.latest`).

A signature's first call is its warm-up, a real run allocating from the family's pool (a
throwaway run right before the capture would run a backward with every saved activation
still alive, and the pool would keep room for both); its second call captures. The same
holds per position (cuda_graphs.py: each layer running one graph with its own weights), so
a training step's layers warm up in the first step and capture in the second, in the
order they run, into one family's pool. An
inference graph's warm-up runs outside the pools: its output, which the caller keeps
while the next call captures, would take pool memory the capture cannot reuse.

What makes sharing safe:
- A graph's outputs are not held by its runner. The call that captures hands out the
  capture's own tensors; later replays hand out tensors over the same memory that own
  nothing (`PoolBuffer`), so a dropped activation is memory the allocator knows is free.
  A forward's saved activations are the same tensors every replay (the runner keeps
  them); a buffer counts them, and is held while anything else refers to one.
- Graphs join a family only before any of its graphs has replayed: until then the
  allocator's view of the pool is exact (every live tensor on it is one it allocated), so
  a capture allocates only memory nothing holds. A later capture takes a pool of its own.
- Before each replay, after its inputs are released, a graph checks the family's outputs
  it may write over (those not alive at the end of its capture). One still held is:
  - a parameter gradient (`.grad` being accumulated): moved out of the pool first (its
    storage takes a copy; torch 2.13), or, where torch cannot move a storage, the graph
    captures again in a pool of its own and its producer stops handing gradients out;
  - an output of this step (a step begins when the family's first graph replays after the
    others replayed in capture order; after a replay out of that order, every output held
    counts as this step's): the graph captures again in a pool of its own, once (a backward
    run with `retain_graph=True` keeps the activations it would reuse);
  - a saved activation of the graph's own last call (a forward called again before that
    call's backward ran): the runner replays another capture of the signature whose
    memory is free, or makes one beside it (cuda_graphs.py, CAPTURES_PER_SIGNATURE).
  - an output of an earlier step: overwritten, as a graph's own outputs always were and as
    `reduce-overhead` does. Outputs are valid until the next step.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any, Iterator, Optional, Sequence

import torch


class PoolBuffer:
    """One storage a captured graph's replays write its outputs into (a pool block its
    capture allocated, or an input's memory it writes over once read), and whether
    anything outside the runner still holds it."""

    __slots__ = ("ptr", "nbytes", "first", "storage", "cdata", "own", "gradient", "saved", "generation", "runners",
                 "views", "free", "__weakref__")

    def __init__(self, owning: Any, gradient: bool, generation: int, runners: bool = False) -> None:
        self.ptr = owning.data_ptr()
        self.nbytes = owning.nbytes()
        # the capture's own storage, which its first call hands out (the allocator's block);
        # none for a runner's own buffer (an input copied there each replay, reused for an output)
        self.first: Optional[weakref.ref] = None if runners else weakref.ref(owning)
        self.runners = runners  # outside the pool: no other graph writes there
        # what later replays hand out: the same memory, owning nothing; held by the runner,
        # so anything else holding it shows as a use count above one
        self.storage = torch._C._construct_storage_from_data_pointer(self.ptr, owning.device, self.nbytes)
        self.cdata = self.storage._cdata
        self.own = 1  # references to `storage` that are the runner's: itself and `views`
        self.gradient = gradient  # a parameter's gradient: never overwritten while held
        self.saved = False  # only saved activations on it (a forward's): held means a backward still to run
        self.generation = generation  # the family's step that last wrote it
        # found let go since its producer last replayed: nothing hands it out again until that
        # replay (which clears this), so a replay judging what it may write over asks no more
        self.free = False
        # the tensors every replay hands out again on it (saved activations: CapturedOutputs),
        # each holding `storage` once more
        self.views: list[torch.Tensor] = []

    def held(self) -> bool:
        # asked of 150-400 buffers before every replay: the cheapest test first
        if storage_use_count(self.cdata) > self.own:
            return True
        if self.first is not None:
            st = self.first()
            if st is not None and st.data_ptr() == self.ptr:  # not if moved out (another buffer of this memory)
                return True
            self.first = None
        # a view handed out again is held when C++ holds it (autograd's saved variable) or
        # Python does: the list, the loop's name and getrefcount's argument are ours
        for t in self.views:
            if t._use_count() > 1 or _refcount(t) > 3:
                return True
        return False

    def add_view(self, meta: dict) -> None:
        self.views.append(_view(meta, self.storage))
        self.own += 1

    def move_out(self) -> None:
        """Whoever holds this memory gets a copy of it in memory of its own, and the graph
        keeps writing the pool's (torch 2.13's `_swap_data_ptr_`)."""
        first = self.first() if self.first is not None else None
        if first is not None:
            fresh = first.clone()
            first._swap_data_ptr_(fresh)  # `fresh` now owns the pool block, which it frees
            del fresh
            self.first = None
        if torch._C._storage_Use_Count(self.storage._cdata) > 1:
            fresh = self.storage.clone()
            self.storage._swap_data_ptr_(fresh)  # the holders' storage now owns the copy
            self.storage = fresh  # and this one the pool memory, owning nothing
            self.cdata = fresh._cdata


# CUDA builds build a tensor over a storage from its metadata in one C++ call (Inductor's
# CUDA graph trees do); elsewhere (the CPU tests) `set_` does the same
_FROM_METADATA = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)
storage_use_count = torch._C._storage_Use_Count
_refcount = sys.getrefcount


def _view(meta: dict, storage: Any) -> torch.Tensor:
    if _FROM_METADATA is not None and meta["device"].type == "cuda":
        return _FROM_METADATA(meta, storage)
    return torch.empty(0, dtype=meta["dtype"], device=meta["device"]).set_(
        storage, meta["storage_offset"], meta["size"], meta["stride"])


_POOL_CALLS = all(hasattr(torch._C, n) for n in ("_cuda_beginAllocateCurrentThreadToPool", "_cuda_endAllocateToPool",
                                                  "_cuda_releasePool"))


class CapturedOutputs:
    """A captured graph's outputs as places in memory: each tensor output is a view of one
    of its `buffers` or, aliasing a parameter, kept as it is. A buffer is pool memory the
    capture allocated, or memory of an input the graph writes over once it has read it
    (kernels reuse a dead input's memory): another graph's output it reads in place (a saved
    activation; BERT's backward writes 29 of its 106 gradients there), or the static buffer
    the runner copies an input into."""

    def __init__(self, outs: Sequence[Any], fixed_ptrs: set[int], gradients: set[int], generation: int,
                 runners_ptrs: frozenset = frozenset(), saved_from: Optional[int] = None) -> None:
        self.buffers: list[PoolBuffer] = []
        self.specs: list[tuple] = []  # per output: ("value", v) | ("view", buffer index, metadata)
        # per output, (its buffer's views, index) for the tensor every replay hands out again, or None
        self.reused: Optional[list] = None
        by_ptr: dict[int, int] = {}
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor) or o.untyped_storage().nbytes() == 0:
                self.specs.append(("value", o))
                continue
            st = o.untyped_storage()
            ptr = st.data_ptr()
            if ptr in fixed_ptrs:
                self.specs.append(("value", o))  # a view of a parameter: its own memory, not the pool's
                continue
            k = by_ptr.get(ptr)
            if k is None:
                k = by_ptr[ptr] = len(self.buffers)
                self.buffers.append(PoolBuffer(st, False, generation, runners=ptr in runners_ptrs))
            if i in gradients:
                self.buffers[k].gradient = True
            meta = {"size": o.shape, "stride": o.stride(), "storage_offset": o.storage_offset(), "dtype": o.dtype,
                    "device": o.device, "data_ptr": ptr, "nbytes": st.nbytes()}
            self.specs.append(("view", k, meta))
        # a forward's outputs from `saved_from` on are saved for its backward; a buffer the
        # user's outputs are not on holds only those
        user = {spec[1] for i, spec in enumerate(self.specs)
                if spec[0] == "view" and (saved_from is None or i < saved_from)}
        self.saved = [b for k, b in enumerate(self.buffers) if saved_from is not None and k not in user]
        for b in self.saved:
            b.saved = True

    def tensors(self) -> list:
        """This replay's outputs: fresh tensors over the buffers (autograd's AccumulateGrad
        keeps a fresh gradient as `.grad` instead of cloning it), but for the saved
        activations, which the replays hand out again: autograd saves them for the backward
        and lets go, and no user sees them. Building a tensor costs 1.5 us of host time: a
        training forward saves 150-320 (Inductor's CUDA graph trees reuse theirs the same way)."""
        if self.reused is None:
            self.reused = self._reused()
        out = []
        buffers = self.buffers
        for spec, again in zip(self.specs, self.reused):
            if again is not None:
                out.append(again[0][again[1]])
            elif spec[0] == "value":
                out.append(spec[1])
            else:
                out.append(_view(spec[2], buffers[spec[1]].storage))
        return out

    def _reused(self) -> list:
        reused: list = [None] * len(self.specs)
        for i, spec in enumerate(self.specs):
            if spec[0] == "view" and self.buffers[spec[1]].saved:
                b = self.buffers[spec[1]]
                reused[i] = (b.views, len(b.views))  # the list is their only holder: `held` counts on it
                b.add_view(spec[2])
        return reused

    def ptrs(self) -> set[int]:
        return {b.ptr for b in self.buffers}

    def saved_held(self) -> bool:
        """Whether a saved activation of the last call is still held: its backward has not run
        (another forward came first) or kept it (`retain_graph=True`)."""
        for b in self.saved:
            if b.held():
                return True
        return False

    def held(self) -> bool:
        return any(b.held() for b in self.buffers)


class GraphFamily:
    """Graphs sharing one memory pool: their warm-up runs (each graph's first call, a real
    run allocating from the pool) and their captures, in the order they were captured (the
    order they replay in within a step). The family holds the pool from its first warm-up
    or capture until it is gone; each captured graph holds it too."""

    _all: "weakref.WeakSet[GraphFamily]" = weakref.WeakSet()
    # families with a parked member whose output is still held, kept alive here: nothing else
    # may refer to such a family (its runner dropped the capture, the held tensors own none of
    # its memory), and the cycle collector freed it and its pool under those tensors (a layer
    # graph captured again while the step still held its last output; on the CPU's simulated
    # capture, a backward then read freed memory)
    _holding: "set[GraphFamily]" = set()
    # the family each device's last warm-up or capture allocated in: a graph that reads no
    # open family's output in place joins it (`latest`), so that one step's graphs share one
    # pool, as reduce-overhead's share its tree's. A family per graph that read only eager
    # tensors left the first step's warm-ups a pool no capture reused (BART's training, an
    # eager mask between its graphs: 4.8 GB beside the captures' own, 10.7 GB of pools
    # against reduce-overhead's 6.1; H200, fiftieth session)
    _latest: "dict[int, weakref.ref[GraphFamily]]" = {}

    def __init__(self, device: int, handle: Any) -> None:
        self.device = device
        self.handle = handle  # the pool every member allocates from
        self.sealed = False  # a member has replayed: no capture joins from here on
        self.members: list[Any] = []  # the captures (`Captured`), parked ones included
        self.generation = 0  # steps begun (replays of its first graph)
        self.last_index = -1  # capture index of the member that replayed last
        self.program_step: Any = None  # the program's step (step_clock.py) of the last replay
        self.disordered = False  # a member replayed out of capture order since the step began
        self.version = 0  # bumped when members change or park: each member's watch list is rebuilt
        # (version, capture index of the first member not parked): asked at every replay, where a
        # scan of the members cost BART's training 0.4 ms a step (38 replays, ~80 members)
        self._first = (-1, -1)
        self.joined = 0  # captures that joined, parked and pruned ones included: the next one's index
        self.out_ptrs: set[int] = set()  # addresses of what its warm-ups and captures returned
        # what its warm-ups returned, by address, while alive, with the id of the runner that
        # warmed up: another graph reading one captures later
        self._warm_outs: dict[int, tuple[weakref.ref, int]] = {}
        self._holds_pool = False
        GraphFamily._all.add(self)

    @staticmethod
    def of(ptrs: set[int], device: int, warm_up: bool = False) -> Optional["GraphFamily"]:
        """A family no capture is closed to whose warm-ups or captures returned one of `ptrs`.
        For a warm-up, only one with no capture yet: nothing would keep a captured graph's
        replays from writing over what the warm-up allocated where that graph's capture
        freed memory."""
        for fam in list(GraphFamily._all):
            if not fam.sealed and fam.device == device and ptrs & fam.out_ptrs and not (warm_up and fam.members):
                return fam
        return None

    @staticmethod
    def latest(device: int, warm_up: bool = False) -> Optional["GraphFamily"]:
        """The family `device`'s last warm-up or capture allocated in, while no capture is
        closed to it (for a warm-up, while it has no capture: see `of`)."""
        ref = GraphFamily._latest.get(device)
        fam = ref() if ref is not None else None
        if fam is None or fam.sealed or (warm_up and fam.members):
            return None
        return fam

    def warmed_up(self, outs: Iterator[torch.Tensor], runner: Any) -> None:
        self._warm_outs.update((o.untyped_storage().data_ptr(), (weakref.ref(o), id(runner))) for o in outs)

    def warm_output(self, t: torch.Tensor, runner: Any) -> bool:
        """Whether `t` is on an output of a warm-up of another runner than `runner` that is
        still alive (a graph's own output fed back, a recurrent state, is not)."""
        ptr = t.untyped_storage().data_ptr()
        found = self._warm_outs.get(ptr)
        if found is None:
            return False
        out = found[0]()
        if out is not None and out.untyped_storage().data_ptr() == ptr:
            return found[1] != id(runner)
        del self._warm_outs[ptr]
        return False

    def unused(self) -> bool:
        """Whether nothing allocated in the pool yet: no warm-up, no capture."""
        return not self._holds_pool and not self.members

    def hold_pool(self) -> None:
        """Make the pool and hold it until the family is gone (torch's pool calls; without
        them a capture makes the pool and warm-ups allocate from the general one)."""
        GraphFamily._latest[self.device] = weakref.ref(self)
        if _POOL_CALLS and not self._holds_pool:
            torch._C._cuda_beginAllocateCurrentThreadToPool(self.device, self.handle)
            torch._C._cuda_endAllocateToPool(self.device, self.handle)
            self._holds_pool = True

    @contextlib.contextmanager
    def allocating(self) -> Iterator[None]:
        """What this thread allocates meanwhile comes from the pool."""
        self.hold_pool()
        if not self._holds_pool:
            yield
            return
        torch._C._cuda_beginAllocateCurrentThreadToPool(self.device, self.handle)
        try:
            yield
        finally:
            torch._C._cuda_endAllocateToPool(self.device, self.handle)
            torch._C._cuda_releasePool(self.device, self.handle)

    def reserve(self, nbytes: int) -> None:
        """Reserve `nbytes` of the pool as one free segment (pool_reserve.py says when and
        why; an inference graph's pool reserves at its capture), on the current stream: the
        allocator hands a free block only to requests of the stream it was freed on, and the
        warm-ups and captures allocate on theirs. Call inside `allocating()`, before anything
        else allocates in the pool."""
        if nbytes and self._holds_pool:
            # freed at once, back to the pool: one free segment the warm-up's allocations split
            torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", self.device))

    def __del__(self) -> None:
        if self._holds_pool:
            try:
                torch._C._cuda_releasePool(self.device, self.handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def join(self, captured: Any) -> int:
        """Add a capture; returns its index, the order it replays in within a step."""
        self._prune_with_holding()
        self.members.append(captured)
        self.version += 1
        self.joined += 1
        return self.joined - 1

    def begin_replay(self, index: int, step: int) -> bool:
        """A member replays in the program's `step` (step_clock.py). The first member's replay
        in a step of the program after the family's last replay begins the family's step: what
        the others wrote before it is of the last step, and may be overwritten, if they replayed
        in capture order. Out of that order, a member's outputs may be of this step whatever
        their step number says: True then, for the first member, to judge them before the new
        step begins (`end_step_check`). The first member replaying within the program step of
        an earlier replay is out of order too: graphs of two models in one pool whose order
        changes from step to step (a GAN's generator, then its critic, which replayed first
        in the critic's own step) had the generator's saved activations taken for an earlier
        step's, to be written over while held."""
        self.sealed = True
        if GraphFamily._holding:  # a step in which nothing captures still lets go of what was let go
            GraphFamily.prune_holding()
        if self._first[0] != self.version:
            self._first = (self.version, min((m.index for m in self.members if not m.parked), default=-1))
        first = self._first[1] if self._first[1] >= 0 else index
        check_first = False
        new_step, self.program_step = step != self.program_step, step
        if index == first and new_step:
            check_first = self.disordered
            if not check_first:
                self.generation += 1
            self.disordered = False
        elif index <= self.last_index or index == first:
            self.disordered = True
        self.last_index = index
        return check_first

    def end_step_check(self) -> None:
        """The first member's replay, out of order, has judged what the others wrote: the new
        step begins."""
        self.generation += 1

    def leave(self, captured: Any) -> None:
        """A member's graph is dropped. While something still holds one of its outputs the
        capture stays (parked): its graph keeps the pool's memory under those tensors, and
        the others still must not write over them."""
        captured.park()
        self.version += 1
        self._prune_with_holding()

    def prune(self) -> None:
        """Drop the parked captures nothing holds an output of any more."""
        parked = [m for m in self.members if m.parked and not m.outputs.held()]
        for m in parked:
            self.members.remove(m)
        if parked:
            self.version += 1
        if any(m.parked for m in self.members):
            GraphFamily._holding.add(self)
        else:
            GraphFamily._holding.discard(self)

    def _prune_with_holding(self) -> None:
        """`prune` this family and the families kept for their parked captures, each once."""
        for fam in {self, *GraphFamily._holding}:
            fam.prune()

    @staticmethod
    def prune_holding() -> None:
        """Prune the families kept for their parked members' held outputs (at each capture,
        each dropped one, each replay while there are such families, and at
        `torch._dynamo.reset()`): one whose outputs are all let go is then free to go."""
        for fam in list(GraphFamily._holding):
            fam.prune()

    def watch(self, captured: Any) -> tuple[list[tuple[PoolBuffer, Any]], list[tuple[PoolBuffer, Any]]]:
        """(buffer, a weak reference to its producing runner) for each buffer of the other
        members that `captured`'s replay may write over: all but those alive at the end of
        its capture and the runners' own static buffers (no other graph writes there). Its
        own outputs are overwritten by design, but for its gradients, which the runner checks
        before copying its inputs. Not the producing capture itself: two captures watching
        each other would be a reference cycle, freed only by the cycle collector.
        Returned twice: all of them, and those a replay in capture order may find of this
        step (the members captured before it; gradients, which outlive steps, of all): with
        one pool a step, judging every member's buffers at every replay cost BART's training
        12k checks a step."""
        allowed = captured.allowed
        every = [(b, m.runner, m.index < captured.index) for m in self.members if m is not captured
                 for b in m.outputs.buffers if not b.runners and b not in allowed]
        return [(b, r) for b, r, _ in every], [(b, r) for b, r, before in every if before or b.gradient]
