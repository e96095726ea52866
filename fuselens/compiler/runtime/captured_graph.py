"""What one CUDA graph capture of a compiled graph holds (cuda_graphs.py's `CudaGraphRunner`
makes them): its static inputs, which of them it reads in place, its outputs in its
family's pool, and what a replay needs worked out once."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence

import torch

from fuselens.compiler.runtime.capture_inputs import overlapping
from fuselens.compiler.runtime.cuda_graph_pool import CapturedOutputs, GraphFamily, PoolBuffer

if TYPE_CHECKING:
    from fuselens.compiler.runtime.cuda_graphs import CudaGraphRunner


class Captured:
    """One captured signature of a runner: what its replays read and write."""

    __slots__ = ("static", "in_place", "lent", "graph", "outputs", "family", "index", "allowed", "parked", "runner",
                 "watch", "watch_in_order", "watch_version", "plan", "into_pool", "spans", "successor", "__weakref__")

    def __init__(self, static: list, in_place: set[int], lent: list[int], graph: Any, outputs: CapturedOutputs,
                 family: GraphFamily, allowed: "weakref.WeakSet[PoolBuffer]", runner: "CudaGraphRunner") -> None:
        self.static = static  # inputs: copies (replays copy into them), parameters, aliases of borrowed outputs
        self.in_place = in_place  # positions read in place (parameters, static inputs, other graphs' outputs)
        self.lent = lent  # those of them that are other graphs' outputs
        self.graph = graph
        self.outputs = outputs
        self.family = family
        self.allowed = allowed  # the family's buffers alive at the end of the capture: never written by it
        self.parked = False  # its runner dropped it, but an output of it is still held
        self.runner = weakref.ref(runner)
        self.index = family.join(self)
        self.watch: list = []
        self.watch_in_order: list = []  # `watch`'s buffers a replay in capture order may find of this step
        self.watch_version = -1
        # what a replay needs, worked out once: (positions copied or compared, positions read
        # in place, the static inputs' addresses for one C++ comparison or None)
        tensors = all(isinstance(a, torch.Tensor) for a in static)
        ptrs = [a.data_ptr() for a in static] if PTRS_EQUAL is not None and tensors else None
        self.plan = ([i for i in range(len(static)) if i not in in_place], sorted(in_place), ptrs)
        self.into_pool: list[tuple[int, int]] = []  # (start, end) of the input copies made in the pool, sorted
        # copied inputs whose elements share memory (an expanded mask): replays copy what they span
        self.spans = frozenset(i for i in self.plan[0] if isinstance(static[i], torch.Tensor) and overlapping(static[i]))
        # the capture of the signature its runner's next call replayed last time: a layer's
        # graph is called for each layer in turn, each replaying its own capture
        self.successor: Optional[weakref.ref] = None

    def reads_in_place(self, args: Sequence[Any]) -> bool:
        """Whether `args` have the addresses this capture reads in place."""
        return all(args[i].data_ptr() == self.static[i].data_ptr() for i in self.in_place)

    def moved(self, args: Sequence[Any]) -> set[int]:
        """Positions this capture reads in place whose inputs `args` have elsewhere."""
        return {i for i in self.in_place if args[i].data_ptr() != self.static[i].data_ptr()}

    def other_module_state(self, args: Sequence[Any]) -> bool:
        """Whether the inputs this capture reads in place that `args` have elsewhere are all
        module state (parameters, and buffers Dynamo marks static, such as a rotary
        embedding's frequencies), none another graph's output: another copy of the model,
        which Dynamo compiled once with this one (its state is the graph's inputs), so that
        the two copies' calls alternate. Kept beside the new capture, this one also keeps its
        state alive where a model was given new parameters for good; CAPTURES_PER_SIGNATURE
        bounds that."""
        moved = self.moved(args)
        return bool(moved) and not moved & set(self.lent)

    def park(self) -> None:
        """Dropped by its runner (GraphFamily.leave), kept while an output of it is held, never
        replayed: it lets go of its inputs, or a parameter read in place would keep its gradient,
        such an output, and so itself alive for good (after `torch._dynamo.reset()`: 16 MB a run)."""
        self.parked = True
        self.static = []
        self.plan = ([], [], None)

    def still_fed(self, replayed: set[int]) -> bool:
        """Whether the other graphs' outputs it reads in place are still what their live
        captures write (else they captured again: this capture is stale)."""
        return bool(self.lent) and all(self.static[i].untyped_storage().data_ptr() in replayed for i in self.lent)


class Hit(NamedTuple):
    """A captured signature, looked up once."""

    key: tuple  # the input signature
    captured: Captured


# one C++ call comparing the addresses of many inputs (CUDA builds; Inductor's CUDA graphs use it)
PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
