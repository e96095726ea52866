"""CUDA graphs for compiled Triton graphs (option `cuda_graphs`, CUDA only).

A signature's calls in the step of its first call run normally (warm-ups: compiling
and tuning kernels); its first call in a later step (`step_clock.py`: the program's steps as
reduce-overhead tells them apart) captures one CUDA graph; later calls copy the inputs
into the graph's static buffers and replay it. The copies are a kernel of their own in the report
(`cudagraph_input_copies`); parameters, buffers and the outputs other graphs replay
into (a model's logits handed to its loss after a graph break) are not copied: their
address is stable, and one that moves re-captures. Each set of module state a graph reads
in place is a position of its own, with a warm-up and a capture kept beside the others
(`Captured.other_module_state`): the layers that run one layer's graph after a graph break
inside it, or another copy of the model, which Dynamo compiled once with the first. A replay
finds the next layer's capture from the one before it (`Captured.successor`), without
building the call's signature. Outputs live in a memory pool shared
with the graphs they feed (a training forward and its backward: cuda_graph_pool.py says
how and when that is safe) and are valid until the next step, as with Inductor's CUDA graphs.

Outputs are handed out as fresh tensors on that memory, which the runner does not hold
(but for a forward's saved activations, the same tensors every replay, which only autograd
sees: cuda_graph_pool.py): autograd's AccumulateGrad takes a backward's parameter gradients
as `.grad` instead of cloning each (it clones a gradient another reference holds: 57-161
copies a step in the models of benchmarks.models, 0.25-0.5 ms). A `.grad` still holding
one when a graph that writes there replays (gradient accumulation) is first moved out of
the pool: its storage gets a copy of the values, the graph keeps the pool memory.

`torch._dynamo.reset()` drops every captured graph (entry.py's `_reset`, from every reset),
with the parameters and pools it held, as it resets Inductor's CUDA graph trees. How one
capture runs (its stream, the collector, cuBLAS's workspaces, a refused capture put
right): capture_context.py.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional, Sequence

import torch

from fuselens.compiler.runtime import captured_graph
from fuselens.compiler.runtime.capture_context import (capturing, cublas_workspace_bytes, library_workspaces_in_pool,
                                                       no_collection, warm_up_stream)
from fuselens.compiler.runtime.capture_failure import failure_site, plan_of, report_failed_capture
from fuselens.compiler.runtime.capture_inputs import alias, copy_all, on_copies, overlapping, span
from fuselens.compiler.runtime.captured_graph import Captured, Hit
from fuselens.compiler.runtime.cuda_graph_pool import CapturedOutputs, GraphFamily, storage_use_count
from fuselens.compiler.runtime.pool_reserve import graph_reservation
from fuselens.compiler.runtime.step_clock import STEP_CLOCK
from fuselens.kernel_timing import KernelTimer


# Captures again, of one input signature, because an input read in place moved, after which
# that graph copies its inputs instead: each capture is a warm-up run, and graphs that feed
# each other would otherwise capture on every call. Before this limit, borrowing stopped at the
# first move: GPT-2's training backward then copied its 79 saved activations (846 MB) into
# static buffers on every replay (0.92x of reduce-overhead, twice its peak memory).
MOVES_BEFORE_COPYING = 4
# Captures again, alone in a pool, because a tensor a replay would write over was still held
# (cuda_graph_pool.py), after which the graph runs with plain launches: each such capture
# leaves the tensor's memory to its old pool, and a program that keeps doing it would
# otherwise capture on every call.
CONFLICTS_BEFORE_PLAIN = 4
# Captures of one signature and one position kept side by side, each with memory of its own,
# when the memory of the one a call would replay is still in use: a forward called again
# before the last call's backward ran (two views of a batch through one model, a triplet
# loss's three), and the backwards reading each one's saved activations in place. Each call
# then replays one whose memory is free. Before, such a forward captured again on every
# call, then ran with plain launches.
CAPTURES_PER_SIGNATURE = 3
# Positions of one signature kept side by side: captures reading other parameters or other
# graphs' outputs in place. A graph break inside a repeated block (BART's layers under
# transformers 5.17) makes one compiled graph that every layer runs with its own weights:
# each layer is a position with a capture of its own, as Inductor's CUDA graph trees record
# one per call. Past this many, the least recently replayed is dropped.
POSITIONS_PER_SIGNATURE = 64
# A graph that captured one position again this many times within its last RECAPTURE_WINDOW
# calls runs with plain launches from then on. Each capture is a warm-up run and leaves a
# pool behind: before positions, BART's training on the H200 (transformers 5.17: one layer's
# code compiled once and run by every layer) captured its layer backward 62 times and its
# forward 15, 62 ms a step against reduce-overhead's 20 and 11.8 GB of pools (forty-fifth session).
RECAPTURES_BEFORE_PLAIN = 12
RECAPTURE_WINDOW = 48
# A position captures in a step after the one its warm-up ran in (`StepClock`), as
# reduce-overhead records only in a generation after its warm-ups. A graph called twice a step
# with the same module state (BART's mask graph, for its encoder and its decoder) captured at
# its second call in the first step, while that step's warm-ups held their memory in the pool:
# the capture took a pool of 4.8 GB of its own, and the second step's captures pools of their
# own. Where one call into compiled code runs a graph again and again (a whole training loop
# compiled, a graph break inside it), there is no next step: the call this many times into a
# step captures. More than a model has layers: a graph every layer runs with the same state
# (no weights of its own) still waits for the next step.
WARM_UPS_IN_ONE_STEP = 64


class CudaGraphRunner:
    """Replays a captured CUDA graph of a compiled graph."""

    _boxed_call = True
    # runners alive now: an input that is another graph's replayed output (a model's
    # logits handed to its loss after a graph break) keeps its address from call to call
    # like a parameter, so it is read in place instead of copied (GPT-2: 0.5 ms a step)
    _live: "weakref.WeakSet[CudaGraphRunner]" = weakref.WeakSet()
    _captures = 0  # bumped by every capture: what `_replayed` caches is valid until the next

    def __init__(self, runner: Any, graph_id: str, timer: Optional[KernelTimer], static_inputs: Optional[set[int]] = None,
                 mutated_inputs: Sequence[int] = (), gradient_outputs: Sequence[int] = (),
                 saved_from: Optional[int] = None, inference: bool = False) -> None:
        self.runner = runner
        # a graph compiled for inference (no autograd): its warm-up runs outside the pools
        self.inference = inference
        # a forward's outputs from this one on are saved for its backward (AOTAutograd's order)
        self.saved_from = saved_from
        # outputs that are parameters' gradients (a backward's): never overwritten while held
        self.gradient_outputs = sorted(gradient_outputs) if _CAN_COUNT_REFERENCES else []
        # gradients handed to autograd as tensors only it holds (AccumulateGrad keeps them as
        # `.grad`); off where a held one could not be moved out (torch 2.11): the runner then
        # keeps the last replay's, so that autograd copies them
        self.hand_out = True
        self._kept: list = []
        # inputs the graph overwrites: a copied one is copied back after each replay
        self.mutated_inputs = list(mutated_inputs)
        self.graph_id = graph_id
        stage = graph_stage(graph_id)
        self.backward = stage == "aot_backward"  # never begins a step (`StepClock`)
        self.training_forward = stage == "aot_forward"
        # replayed in place, like Parameters; a moved one is captured again (see __call__)
        self.static_inputs = set(static_inputs or ())
        # the graph's timer (option time_kernels): a replay is timed whole, and the input copies
        # before it, not the kernels inside it
        self.timer = timer
        self.graphs: dict[tuple, Captured] = {}  # signature -> the capture its calls replay first
        self.spares: dict[tuple, list[Captured]] = {}  # signature -> its other captures (CAPTURES_PER_SIGNATURE)
        # signatures whose first call ran, with the family it allocated in (None: outside the pools)
        self.warm: dict[tuple, Optional[GraphFamily]] = {}
        # (signature, addresses of the module state it reads) -> (the step of its last warm-up,
        # warm-ups in that step): a position captures in a later step, in the order the steps
        # replay them (a layer's graph captured for layer 2 in the first step, for layer 1 in
        # the second, was out of that order: its replays could write over layer 1's activations)
        self.warm_positions: dict[tuple, tuple[int, int]] = {}
        self.reported = False
        self.outputs: set[int] = set()  # addresses of the captured graphs' output buffers
        self.borrow = True  # may read other graphs' replayed outputs in place
        self.borrowed: set[tuple] = set()  # input signatures captured reading one
        self.moves: dict[tuple, int] = {}  # signature -> captures since an input it read in place moved
        self._replayed_at: Optional[tuple] = None  # (captures, live runners) `_replayed_cache` is of
        self._replayed_cache: set[int] = set()
        # the last replay's signature with what a replay needs of it: a signature is a tuple of a
        # tuple per input, which Python hashes anew at every lookup (ResNet-50's 321 inputs: three
        # lookups a replay were 40-60 us of its host time)
        self._last_hit: Optional[Hit] = None
        self._step = -1  # the step of the last call (step_clock.py)
        self._step_began: Optional[Hit] = None  # what that step's first call replayed (`_begin_step`)
        self.failed = ""  # why a capture failed: from then on the graph runs with plain launches
        self.captures_made = 0  # replaced ones included: each replaced one left its pool to the allocator's cache
        self.calls = 0  # calls since the runner was made: how recent its captures are (RECAPTURE_WINDOW)
        self._capture_calls: list[int] = []  # the call each of its last RECAPTURES_BEFORE_PLAIN captures came at
        self.conflicts = 0  # captures again because a tensor it would write over was still held
        self.last_conflict = ""
        self.constant_ptrs = _constant_ptrs(runner)
        CudaGraphRunner._live.add(self)

    @staticmethod
    def _key(args: Sequence[Any]) -> tuple:
        return tuple((tuple(a.shape), tuple(a.stride()), a.dtype, a.device) if isinstance(a, torch.Tensor) else ("v", a)
                     for a in args)

    def __call__(self, args: list) -> Any:
        if self.failed:
            return self.runner(args)
        self.calls += 1
        step = STEP_CLOCK.of_call(self.backward, self.training_forward)
        if step != self._step:
            self._step = step
            self._begin_step()
        hit = self._last_hit
        if hit is not None:
            if self._same_call(hit, args):
                if self._step_began is None:
                    self._step_began = hit
                return self._replay(hit, args)
            nxt = self._successor(hit, args)
            if nxt is not None:
                self._swap_in(hit.key, nxt)
                return self._replay(self._remember(hit.key), args)
        del hit
        key = self._key(args)
        ent = self.graphs.get(key)
        if ent is not None:
            params = ent.in_place
            fits = ent.reads_in_place(args)
            copies = fits and self._copies_a_replayed_output(args, params)
            if not fits or copies:
                spare = self._spare_for(key, args)
                if spare is not None:  # another call's saved activations, another position
                    self._swap_in(key, spare)
                    return self._replay(self._remember(key), args)
            if not fits:
                if ent.still_fed(self._replayed()) or ent.other_module_state(args):
                    # another position: another layer running this graph, another copy of the model
                    if not self._position_warm(key, args):
                        return self._warm_up(key, args)
                    if self._keep_as_spare(key):
                        return self._capture_and_replay(key, args, new_position=True)
                ent = None  # a parameter moved: capture again
                if key in self.borrowed:
                    # an input read in place moved: its graph captured again. While a training
                    # step warms up, each graph upstream captures again once it reads its own
                    # upstream's outputs in place (GPT-2: the loss's backward, then the model's);
                    # two graphs feeding each other would move each other's on every call
                    self.moves[key] = self.moves.get(key, 0) + 1
                    self.borrow &= self.moves[key] <= MOVES_BEFORE_COPYING
            elif copies:
                ent = None  # an input is now another graph's replayed output: captured again to read it in place
        if ent is None:
            if key not in self.warm or not self._position_warm(key, args):
                return self._warm_up(key, args)
            return self._capture_and_replay(key, args)
        return self._replay(self._remember(key), args)

    def _warm_up(self, key: tuple, args: list) -> Any:
        """A signature's first call: a real run (compiling and tuning the kernels) on the
        stream captures use, allocating from the pool of the family whose outputs it reads
        (else a new one), as reduce-overhead's warm-ups do. A throwaway warm-up right before
        each capture instead ran a backward with every saved activation still alive: its
        pool kept room for both (BERT training: 1.55x reduce-overhead's reserved memory).
        An inference graph's warm-up runs outside the pools (`_warm_up_outside_pools`)."""
        where, step = (key, self._position(args)), self._step
        last, times = self.warm_positions.get(where, (None, 0))
        self.warm_positions[where] = (step, times + 1 if last == step else 1)
        if len(self.warm_positions) > 2 * POSITIONS_PER_SIGNATURE:
            return self._plain_from_now(args, (
                f"its calls brought {len(self.warm_positions)} sets of parameters at new addresses, each warmed "
                "up and captured anew (parameters replaced on every call), where a graph run by several layers "
                "has one set a layer"))
        if self.inference:
            return self._warm_up_outside_pools(key, args)
        device = torch.cuda.current_device()
        ptrs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        family = GraphFamily.of(ptrs, device, warm_up=True) or GraphFamily.latest(device, warm_up=True)
        new_pool = family is None
        if new_pool:
            family = GraphFamily(device, torch.cuda.graph_pool_handle())
        side = warm_up_stream(device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), family.allocating(), library_workspaces_in_pool():
            if new_pool:
                family.reserve(graph_reservation(self.runner, cublas_workspace_bytes()))
            outs = self.runner(args)
        torch.cuda.current_stream().wait_stream(side)
        family.out_ptrs |= {o.untyped_storage().data_ptr() for o in outs if isinstance(o, torch.Tensor)}
        # what the warm-up allocated: not its inputs handed back (a weight a forward saves for
        # its backward: held for good, it kept every later backward from capturing)
        kept = ptrs | self.constant_ptrs
        family.warmed_up((o for o in outs if isinstance(o, torch.Tensor)
                          and o.untyped_storage().data_ptr() not in kept), self)
        self.warm[key] = family
        return outs

    def _warm_up_outside_pools(self, key: tuple, args: list) -> Any:
        """An inference graph's first call: a plain run, allocating as eager would. What it
        returns the caller keeps until its next call has returned, and that call captures:
        allocated in the graph's pool, the capture could not reuse it, and the pool held the
        output twice (H200, GPT-2 inference, the language-model head's 393 MB of logits: 1120
        MB against reduce-overhead's 720; BERT 820 against 522). The capture makes the pool
        (`_capture`). A training graph's warm-up must allocate in its family's pool: a
        backward's warm-up reads its forward's outputs there, and a step's outputs die
        before the next step captures."""
        outs = self.runner(args)
        self.warm[key] = None
        return outs

    def _capture_and_replay(self, key: tuple, args: list, new_position: bool = False) -> Any:
        """Capture and replay for this call's result (the kernels ran before, in the warm-up).
        A graph captured before for this signature is not alive during the capture: a
        training forward's saved activations would be held twice (GPT-2: 6.1 GB at its
        peak against 3.3 GB for reduce-overhead). A position's first capture (`new_position`)
        does not count towards RECAPTURES_BEFORE_PLAIN."""
        inputs = list(args)
        args.clear()
        if not new_position and self._recapturing():
            return self._plain_from_now(inputs, (
                f"it captured {RECAPTURES_BEFORE_PLAIN} times in {RECAPTURE_WINDOW} calls: its calls keep bringing "
                "parameters or other graphs' outputs that its capture for that position no longer reads, and each "
                "capture is a warm-up run and a pool"))
        self._forget(key)
        try:
            outs = self._capture(key, inputs)
        except Exception as e:  # noqa: BLE001 - CUDA refused the capture: the graph runs as compiled
            site, location, cause = failure_site(self.runner, e)
            return self._plain_from_now(inputs, f"{site}{type(cause).__name__}: {str(cause)[:300]}", location)
        if new_position:  # the position replayed before this one, kept as a spare, leads here next step
            self.spares[key][-1].successor = weakref.ref(self.graphs[key])
        return self._replay(self._remember(key), inputs, first=outs)

    def _recapturing(self) -> bool:
        """Whether this capture would be the RECAPTURES_BEFORE_PLAIN-th within the runner's
        last RECAPTURE_WINDOW calls (a warm-up's few captures again are not)."""
        recent = self._capture_calls
        recent.append(self.calls)
        del recent[:-RECAPTURES_BEFORE_PLAIN]
        return len(recent) == RECAPTURES_BEFORE_PLAIN and self.calls - recent[0] < RECAPTURE_WINDOW

    def _plain_from_now(self, inputs: list, why: str, location: Any = None) -> Any:
        """This call and every later one with plain launches, and a finding saying `why`; never
        replayed again, the runner lets its captures and warm-up pools (sized for a graph) go."""
        self.failed = why
        report_failed_capture(self.graph_id, why, location)
        self.release()
        return self.runner(inputs)

    def _remember(self, key: tuple) -> Hit:
        """Make `key` the last replayed signature; returns what a replay of it needs."""
        cap = self.graphs[key]
        last = self._last_hit
        if last is not None and last.key == key and last.captured is not cap:
            last.captured.successor = weakref.ref(cap)
        self._last_hit = Hit(key, cap)
        if self._step_began is None:
            self._step_began = self._last_hit
        return self._last_hit

    def _begin_step(self) -> None:
        """A new step's first call: it tries what the last step's first call replayed. Two
        calls of one position a step, each with its own capture (the first call's saved
        activations still held at the second), replay in their captures' order: the next
        step's first call had replayed the second capture, the one replayed last, and the
        first then found that capture's outputs, this step's, in its way (captured again,
        alone)."""
        began, self._step_began = self._step_began, None
        if began is None or began is self._last_hit:  # one capture a step: no signature hashed (see `Hit`)
            return
        key, cap = began
        current = self.graphs.get(key)
        if current is not cap:
            if current is None or cap not in self.spares.get(key, ()):
                return  # dropped since
            self._swap_in(key, cap)
        self._last_hit = began

    def _spare_for(self, key: tuple, args: Sequence[Any]) -> Optional[Captured]:
        """A spare of `key` that `args` fit: it reads in place what they have at its addresses,
        and copies none of them that another graph replays into. A graph called once with a
        tensor of the user's and once with another graph's output in the same place (BART's
        mask graph, for its encoder and its decoder) replays a capture for each; found only
        when it read in place, the other was captured anew on every call."""
        return next((c for c in self.spares.get(key, ())
                     if c.reads_in_place(args) and not self._copies_a_replayed_output(args, c.in_place)), None)

    def _successor(self, hit: Hit, args: list) -> Optional[Captured]:
        """The spare that replayed after `hit` last time, if `args` are its call (the next
        layer's): found without building the call's signature and searching the spares."""
        ref = hit.captured.successor
        nxt = ref() if ref is not None else None
        if nxt is None or nxt.parked or not self._same_call(Hit(hit.key, nxt), args):
            return None
        return nxt if nxt in self.spares.get(hit.key, ()) else None

    def _position(self, args: Sequence[Any]) -> tuple:
        """Which position of its signature a call is, for the warm-up: the addresses of the
        module state it reads (parameters and static inputs: a layer's weights)."""
        static = self.static_inputs
        return tuple(a.data_ptr() for i, a in enumerate(args)
                     if isinstance(a, torch.Tensor) and (i in static or isinstance(a, torch.nn.Parameter)))

    def _position_warm(self, key: tuple, args: Sequence[Any]) -> bool:
        """Whether a call may capture: its position ran a warm-up in an earlier step (or
        WARM_UPS_IN_ONE_STEP in this one), and it reads no output of a warm-up (a backward
        before its forward captured: such a capture copies what it would read in place once
        its forward captures, and captures again then)."""
        warmed = self.warm_positions.get((key, self._position(args)))
        if warmed is None or (warmed[0] == self._step and warmed[1] < WARM_UPS_IN_ONE_STEP):
            return False
        return not any(f.warm_output(a, self) for a in args if isinstance(a, torch.Tensor) for f in GraphFamily._all)

    def _keep_as_spare(self, key: tuple, args: Optional[list] = None) -> bool:
        """Keep the capture `key` replays as a spare, so that the next capture of `key` does
        not replace it. For another capture of the same position as `args` (their memory
        still in use): False when it has CAPTURES_PER_SIGNATURE. For a new position (no
        `args`): the least recently replayed spare is dropped past POSITIONS_PER_SIGNATURE."""
        spares = self.spares.setdefault(key, [])
        if args is not None:
            if sum(c.reads_in_place(args) for c in (self.graphs[key], *spares)) >= CAPTURES_PER_SIGNATURE:
                return False
        elif len(spares) + 1 >= POSITIONS_PER_SIGNATURE:
            self._drop(spares.pop(0))  # `_swap_in` appends the one it replaced: the front replayed longest ago
        spares.append(self.graphs.pop(key))
        self._last_hit = None
        return True

    def _swap_in(self, key: tuple, spare: Captured) -> None:
        """Make a spare the capture `key` replays; the one it replayed becomes a spare."""
        spares = self.spares[key]
        spares.remove(spare)
        spares.append(self.graphs[key])
        self.graphs[key] = spare

    def captures(self) -> list[Captured]:
        """Every live capture: each signature's, and its spares."""
        return [*self.graphs.values(), *(c for caps in self.spares.values() for c in caps)]

    def _forget(self, key: tuple) -> None:
        """Drop the graph of `key`; its pool goes once no graph and no output on it is left."""
        cap = self.graphs.pop(key, None)
        if cap is None:
            return
        if self._last_hit is not None and self._last_hit.key == key:
            self._last_hit = None
        self._drop(cap)

    def _drop(self, cap: Captured) -> None:
        """A capture no longer kept (already out of `graphs` and `spares`): it leaves its family,
        and its outputs are no longer this runner's."""
        if self._step_began is not None and self._step_began.captured is cap:
            self._step_began = None
        cap.family.leave(cap)
        self.outputs = {p for c in self.captures() for p in c.outputs.ptrs()}
        CudaGraphRunner._captures += 1  # other runners' `_replayed` caches hold the old outputs

    def release(self) -> None:
        """Drop every captured graph: its static inputs (a model's parameters among them)
        and, once no output on it is held, its memory pool. A later call captures again."""
        for key in list(self.graphs):
            self._forget(key)
        for key, spares in list(self.spares.items()):
            for cap in spares:
                cap.family.leave(cap)
        self.spares.clear()
        self._step_began = None
        self.outputs = set()
        self._kept = []
        self.warm.clear()
        self.warm_positions.clear()
        self.moves.clear()
        self.borrowed.clear()

    def _same_call(self, hit: Hit, args: list) -> bool:
        """Whether `args` replay the graph the last call replayed: the other inputs of the
        same sizes and strides (scalars equal), the ones read in place at the same address,
        none another graph's replayed output. The slow path's checks, without building a
        signature of every input (ResNet-50's backward has 320: 1.7 ms a step)."""
        cap = hit.captured
        others, in_place, ptrs = cap.plan
        static = cap.static
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
            if not captured_graph.PTRS_EQUAL(args, ptrs, in_place):
                return False
        elif not cap.reads_in_place(args):
            return False
        return not self._copies_a_replayed_output(args, cap.in_place, others)

    def _replay(self, hit: Hit, args: list, first: Optional[list] = None) -> Any:
        """Replay for this call's result: `first`, the capture's own outputs, right after it."""
        key, cap = hit
        copied = cap.plan[0]
        self._kept = []
        if first is None and (cap.outputs.saved or self.gradient_outputs):
            elsewhere = self._replay_elsewhere(key, cap, args)
            if elsewhere is not None:
                return elsewhere[0]
        static, params = cap.static, cap.in_place
        tensors = [i for i in copied if isinstance(args[i], torch.Tensor)]
        sources = [args[i] for i in tensors]
        back = [(args[i], static[i]) for i in self.mutated_inputs if i not in params]
        args.clear()  # the inputs it reads for the last time are free from here (a backward's activations)
        family = cap.family
        if first is None:
            # judged before the inputs are copied: a copy writes the pool, where the capture
            # freed it after its last read
            check_first = family.begin_replay(cap.index, self._step)
            why = self._conflict(cap, check_first or family.disordered)
            if why:
                inputs = list(static)
                for i, a in zip(tensors, sources):
                    inputs[i] = a
                return self._capture_alone(key, inputs, why)
            if check_first:
                family.end_step_check()
        else:  # the capture's own run: its outputs are of this program step, as a replay's
            family.last_index, family.program_step = cap.index, self._step
        dsts = [static[i] for i in tensors]
        if cap.spans:  # expanded inputs: the memory their elements reach, copied as it lies
            for k, i in enumerate(tensors):
                if i in cap.spans:
                    dsts[k], sources[k] = span(dsts[k]), span(sources[k])
        self._copy_inputs(cap, dsts, sources)
        del sources, dsts
        timer = self.timer
        t1 = timer.start() if timer is not None else None
        cap.graph.replay()
        if timer is not None:
            timer.stop("cudagraph_replay", t1)
        copy_all([a for a, _ in back], [s for _, s in back])
        generation = family.generation
        for b in cap.outputs.buffers:
            b.generation = generation
            b.free = False
        result = first if first is not None else cap.outputs.tensors()
        if not self.hand_out and self.gradient_outputs:
            self._kept = [result[i] for i in self.gradient_outputs if i < len(result)]
        return result

    def _replay_elsewhere(self, key: tuple, cap: Captured, args: list) -> Optional[tuple[Any]]:
        """(this call's result,) when this capture's own outputs forbid its replay; else None."""
        if not self._move_out_own_gradients(cap):
            # a held gradient this torch cannot move out: a new graph writes other memory,
            # and its gradients are kept by the runner until the next replay (autograd copies them)
            self.hand_out = False
            return (self._capture_and_replay(key, args),)
        if not cap.outputs.saved_held():
            return None
        # its last call's backward has not run (two forwards before their backwards): another
        # capture of the signature whose memory is free, or a new one beside it
        spare = next((c for c in self.spares.get(key, ())
                      if not c.outputs.saved_held() and c.reads_in_place(args)), None)
        if spare is not None:
            self._swap_in(key, spare)
            return (self._replay(self._remember(key), args),)
        if self._keep_as_spare(key, args):
            return (self._capture_and_replay(key, args),)
        return (self._capture_alone(key, args, "its last calls' saved activations are still held: their backwards "
                                    f"have not run ({CAPTURES_PER_SIGNATURE} forwards or more before their backwards)"),)

    def _copy_inputs(self, cap: Captured, dsts: list, sources: list) -> None:
        """The call's inputs into the capture's static copies, timed as one kernel of the report."""
        # an input on the family's own memory (this graph's last output fed back: a recurrent
        # state) may lie where the copies go, which the capture freed after their last read:
        # copied from a copy of it
        if cap.into_pool:
            pool = cap.family.out_ptrs
            sources = [a.clone() if on_copies(a, pool, cap.into_pool) else a for a in sources]
        timer = self.timer
        t0 = timer.start() if timer is not None else None
        copy_all(dsts, sources)
        if timer is not None:
            timer.stop("cudagraph_input_copies", t0)

    def _move_out_own_gradients(self, cap: Captured) -> bool:
        """A gradient handed out by the last replay and still held (a `.grad` being
        accumulated into) would be overwritten by this one: its holders get a copy of it.
        False when one is held and this torch cannot move a storage's memory."""
        for b in cap.outputs.buffers:
            if b.gradient and b.held():
                if not _CAN_MOVE_STORAGE:
                    return False
                b.move_out()
        return True

    def _conflict(self, cap: Captured, every: bool) -> str:
        """Why this replay must not write over its family's memory now ("" when it may):
        a tensor of the family it may write over (see cuda_graph_pool.py) is still held.
        Held gradients are moved out instead where torch can. Unless `every`, the family's
        members replay in capture order in this step: only those captured before this one
        may have written this step's outputs."""
        family = cap.family
        if cap.watch_version != family.version:
            cap.watch, cap.watch_in_order = family.watch(cap)
            cap.watch_version = family.version
        generation = family.generation
        use_count = storage_use_count
        for b, producer_ref in (cap.watch if every else cap.watch_in_order):
            if b.free or (not b.gradient and b.generation != generation):
                continue  # let go, or an earlier step's output: overwritten whether held or not
            # `held`'s first test inline: a call per buffer was most of this loop's time, BART's
            # training judging 1366 a step
            if use_count(b.cdata) <= b.own and b.first is None and not b.views or not b.held():
                b.free = True
                continue
            if b.gradient:
                if _CAN_MOVE_STORAGE:
                    b.move_out()
                    continue
                producer = producer_ref()
                if producer is not None:
                    producer.hand_out = False
                return "a parameter gradient it may write over is still held (accumulated into)"
            if b.generation == generation:
                return "an output of this step that it may write over is still held (a saved activation " \
                       "kept for another backward, or an output kept past its reader)"
        return ""

    def _capture_alone(self, key: tuple, inputs: list, why: str) -> Any:
        """Capture this signature again in a pool of its own, for this call's result (`inputs`:
        the call's, with the parameters and the outputs read in place)."""
        self.conflicts += 1
        self.last_conflict = why
        if self.conflicts > CONFLICTS_BEFORE_PLAIN:
            return self._plain_from_now(inputs, "its replays kept finding tensors they would overwrite still held: " + why)
        return self._capture_and_replay(key, inputs)

    def _capture(self, key: tuple, inputs: list) -> list:
        """Capture a graph of `inputs`' signature; returns the capture's outputs (what the
        replay right after it writes). Inputs read in place are dropped from `inputs`, and
        copied ones are copied into the family's pool and dropped too, so that the capture
        may reuse the memory of those it reads for the last time."""
        device = torch.cuda.current_device()
        side = warm_up_stream(device)
        side.wait_stream(torch.cuda.current_stream())
        params, borrowed = self._read_in_place(key, inputs)
        family = self._family_to_join(key, inputs, borrowed, device)
        if self.inference and family.unused():  # no warm-up made this pool (`_warm_up_outside_pools`)
            with torch.cuda.stream(side), family.allocating():
                family.reserve(graph_reservation(self.runner, cublas_workspace_bytes()))
        static, pooled, nbytes = self._static_copies(inputs, params, family, side)
        graph = torch.cuda.CUDAGraph()
        run_args = list(static)
        for i in borrowed:  # from here only `run_args` holds them: the run frees each after its last reader
            static[i] = inputs[i] = alias(static[i])
        for i in pooled:
            static[i] = alias(static[i])
        family.hold_pool()
        with library_workspaces_in_pool(), no_collection(), capturing(graph, family.handle, side):
            outs = list(self.runner(run_args))
        del run_args
        lent = set(borrowed)
        fixed = {a.untyped_storage().data_ptr() for i, a in enumerate(static)
                 if isinstance(a, torch.Tensor) and i in params and i not in lent} | self.constant_ptrs
        own = frozenset(a.untyped_storage().data_ptr() for i, a in enumerate(static)
                        if isinstance(a, torch.Tensor) and i not in params and i not in pooled)
        gradients = set(self.gradient_outputs) if self.hand_out else set()
        outputs = CapturedOutputs(outs, fixed, gradients, family.generation, own, self.saved_from)
        allowed = weakref.WeakSet(b for m in family.members for b in m.outputs.buffers if b.held())
        cap = self.graphs[key] = Captured(static, params, borrowed, graph, outputs, family, allowed, self)
        cap.into_pool = sorted((static[i].data_ptr(), static[i].data_ptr() + static[i].untyped_storage().nbytes())
                               for i in pooled)
        self.outputs |= outputs.ptrs()
        family.out_ptrs |= outputs.ptrs()
        self.captures_made += 1
        CudaGraphRunner._captures += 1
        if not self.reported:
            self._report(len(inputs) - len(params), nbytes)
        return outs

    def _read_in_place(self, key: tuple, inputs: list) -> tuple[set[int], list[int]]:
        """Positions a capture of `inputs` reads in place (parameters, static inputs, other
        graphs' outputs), and those of them that are other graphs' outputs."""
        params, borrowed = set(), []
        replayed = self._replayed()
        # a graph's constants (a folded mask a forward saves for its backward) stay where they
        # are as long as their graph lives: read in place like parameters
        constants = {p for r in CudaGraphRunner._live for p in r.constant_ptrs}
        for i, a in enumerate(inputs):
            if not isinstance(a, torch.Tensor):
                continue
            ptr = a.untyped_storage().data_ptr()
            lent = ptr in replayed
            if lent:
                self.borrowed.add(key)
                borrowed.append(i)
            if lent or isinstance(a, torch.nn.Parameter) or i in self.static_inputs or ptr in constants:
                params.add(i)
        return params, borrowed

    def _static_copies(self, inputs: list, params: set[int], family: GraphFamily,
                       side: Any) -> tuple[list, list[int], int]:
        """The capture's inputs, each copied one in a static buffer of its own: (static inputs,
        positions of the copies made in the family's pool, bytes copied). A copy in the pool
        is memory the capture frees after its last read, and reuses (a backward's copied
        output gradient: BERT's logits', 238 MB, was held for good outside the pool), as
        reduce-overhead's do. An input the graph mutates keeps a buffer of its own, outside
        the pool: the replay's result is copied back from it."""
        static = list(inputs)
        copied = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and i not in params]
        mutated = set(self.mutated_inputs)
        pooled = [i for i in copied if i not in mutated]

        def copy(i: int) -> None:
            a = inputs[i]
            if overlapping(a):  # an expanded input: its elements share memory, which copy_ refuses to write
                src = span(a)
                base = torch.empty_strided(src.shape, (1,), dtype=a.dtype, device=a.device).copy_(src)
                static[i] = base.as_strided(a.shape, a.stride())
            else:
                static[i] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)

        for i in copied:
            if i in mutated:
                copy(i)
        if pooled:
            with torch.cuda.stream(side), family.allocating():  # the capture's stream: its blocks are reused there
                for i in pooled:
                    copy(i)
        return static, pooled, sum(inputs[i].untyped_storage().nbytes() for i in copied)

    def _family_to_join(self, key: tuple, inputs: list, borrowed: list[int], device: int) -> GraphFamily:
        """The family of the graph whose outputs this capture reads in place, else the one the
        device's last warm-up or capture allocated in (`GraphFamily.latest`), else the one its
        warm-up ran in, if no capture is closed to it (see cuda_graph_pool.py); else a new one."""
        ptrs = {inputs[i].untyped_storage().data_ptr() for i in borrowed}
        family = GraphFamily.of(ptrs, device) if ptrs else None
        if family is None:
            family = GraphFamily.latest(device)
        if family is None:
            family = self.warm.get(key)
            if family is not None and (family.sealed or family.device != device):
                family = None
        return family or GraphFamily(device, torch.cuda.graph_pool_handle())

    def copied_inputs(self) -> list[tuple[int, tuple, str]]:
        """(position, shape, dtype) of each input a replay copies, over this runner's
        captures (what keeps a graph from reading its inputs in place)."""
        out = []
        for cap in self.captures():
            out += [(i, tuple(a.shape), str(a.dtype).replace("torch.", "")) for i, a in enumerate(cap.static)
                    if isinstance(a, torch.Tensor) and i not in cap.in_place]
        return out

    def _copies_a_replayed_output(self, args: Sequence[Any], params: set[int],
                                  positions: Optional[Sequence[int]] = None) -> bool:
        """Whether an input at `positions` (else all but `params`) is at an address another graph
        replays into. One this graph's own captures write is not: a layer's input is the
        output of its call for the layer before, copied as at the capture, and a backward in
        the same pool writes there later in the step (BART's encoder: captured anew every step)."""
        replayed = self._replayed()
        if not replayed:
            return False
        positions = [i for i in range(len(args)) if i not in params] if positions is None else positions
        return any(isinstance(args[i], torch.Tensor) and (p := args[i].untyped_storage().data_ptr()) in replayed
                   and p not in self.outputs for i in positions)

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


def _constant_ptrs(runner: Any) -> set[int]:
    """Addresses of the tensors a compiled graph holds as constants (folded masks, literals).
    An output that is one (a forward saving Swin's folded attention mask for its backward)
    is not pool memory: the graph holds it for good, so as a saved activation it read as
    held at every call, which captured the forward again, then ran it without CUDA graphs."""
    return {t.untyped_storage().data_ptr() for t in (getattr(plan_of(runner), "constants", None) or {}).values()
            if isinstance(t, torch.Tensor)}


def graph_stage(graph_id: str) -> str:
    """The AOTAutograd stage a compiled graph's id names ("aot_forward" of "3/0:aot_forward#2")."""
    return graph_id.split("#")[0].rsplit(":", 1)[-1]


def release_all() -> None:
    """Every live runner's graphs dropped: `torch._dynamo.reset()` (entry.py's `_reset`), as
    it resets Inductor's CUDA graph trees. Dynamo's reset leaves the
    compiled functions it installed in user modules' globals, and a runner holds its
    static inputs: a model compiled with `cuda_graphs` kept its parameters and pools
    alive after it was gone (GPT-2 training: 2.5 GB)."""
    for runner in list(CudaGraphRunner._live):
        runner.release()
    GraphFamily.prune_holding()


_CAN_COUNT_REFERENCES = hasattr(torch._C, "_storage_Use_Count")
# torch 2.13 moves a held gradient out of the pool; torch 2.11 has no way to, and captures again
# (the storage's `_swap_data_ptr_`, which PoolBuffer.move_out calls)
_CAN_MOVE_STORAGE = hasattr(torch.UntypedStorage, "_swap_data_ptr_")
