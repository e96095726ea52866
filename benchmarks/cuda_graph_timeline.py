"""What fuselens' CUDA-graph runners decide, call by call, for a suite model (CUDA only).

    python -m benchmarks.cuda_graph_timeline --model bart --steps 4 [--mode infer]

Each line: the step (`step_clock.STEP_CLOCK`), Dynamo's generation, the graph, and what its
runner did: a warm-up, a capture (and the family, i.e. the memory pool, it joined, with its
index there), a capture again alone (and why), plain launches from then on (and why), or a
replay (from which family), and for each capture what differs from the capture it replaces
(inputs read in place that moved, ...); after each step, the memory pools the allocator holds (MB
reserved, MB allocated). It found why BART's training held 10.7 GB of pools against
reduce-overhead's 6.1: its first step's warm-ups ran in one pool no capture reused, and the
captures spread over seven others (fiftieth session, benchmarks/RESULTS.md). The runner's
methods are wrapped here, not changed: the numbers are the runner's own.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_cg_timeline_")

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()  # a source checkout (the GPU machine) has no entry point
from benchmarks.cuda_graph_pools import pools  # noqa: E402
from benchmarks.models import make_step, placed  # noqa: E402
from benchmarks.real_models import build  # noqa: E402
from fuselens.compiler.runtime import cuda_graph_pool, cuda_graphs  # noqa: E402
from fuselens.compiler.runtime.step_clock import compiled_calls  # noqa: E402

Line = tuple


def _where() -> tuple[int, int]:
    return cuda_graphs.STEP_CLOCK.step, compiled_calls()[1]


def _wrap(lines: list[Line], name: str, what: Callable[..., str],
          after: Optional[Callable[..., str]] = None) -> None:
    """Log `what(runner, *args)` before each call of the runner's method `name`, and
    `after(runner, *args)`, if given, once it returned."""
    runner = cuda_graphs.CudaGraphRunner
    real = getattr(runner, name)

    @functools.wraps(real)
    def logged(self: Any, *args: Any, **kw: Any) -> Any:
        lines.append((*_where(), self.graph_id, name.lstrip("_"), what(self, *args, **kw)))
        out = real(self, *args, **kw)
        if after is not None:
            lines.append((*_where(), self.graph_id, "  then", after(self, *args, **kw)))
        return out

    setattr(runner, name, logged)


def _joined(self: Any, key: Any, *_: Any) -> str:
    cap = self.graphs[key]
    return f"captured in pool {cap.family.handle} index {cap.index}"


def why_again(self: Any, key: Any, args: Any, new_position: bool = False) -> str:
    """What differs from the capture this signature replayed until now, if any (for a new
    position, the one just set aside as a spare): the inputs it read in place that moved,
    and what each is, whether an input it copies is now another graph's output, whether its
    saved activations are still held, and how many inputs moved for each other spare."""
    prev = self.graphs.get(key)
    spares = list(self.spares.get(key, ()))
    if prev is None and new_position and spares:
        prev = spares.pop()  # `_keep_as_spare` has just moved it there
    if prev is None:
        return "no capture of this signature kept to replay"
    moved = sorted(prev.moved(args))
    what = ", ".join(f"{i} {_input_kind(self, prev, args, i)}" for i in moved[:8])
    copies = self._copies_a_replayed_output(args, prev.in_place)
    return (f"again{' (a new position)' if new_position else ''}: read in place and moved [{what}], "
            f"copies another graph's output {copies}, saved activations held {prev.outputs.saved_held()}"
            + (f"; other spares, inputs moved: {[len(c.moved(args)) for c in spares]}" if spares else ""))


def _input_kind(runner: Any, cap: Any, args: Any, i: int) -> str:
    if isinstance(args[i], torch.nn.Parameter):
        return "(parameter)"
    if i in cap.lent:
        return "(another graph's output)"
    if i in runner.static_inputs:
        return "(static input)"
    return "(other)"


def record(lines: list[Line]) -> None:
    """Wrap the runner's decisions so that each appends a line to `lines`."""
    def position(self: Any, key: Any, args: Any, *_: Any) -> str:
        return f"position {hash(self._position(args)) % 997}"

    _wrap(lines, "_warm_up", position)
    _wrap(lines, "_capture", position, after=_joined)
    _wrap(lines, "_capture_and_replay", why_again)
    _wrap(lines, "_capture_alone", lambda self, key, inputs, why: why[:120])
    _wrap(lines, "_plain_from_now", lambda self, inputs, why, *_: why[:120])
    _wrap(lines, "_replay", lambda self, hit, args, first=None: f"pool {hit[1].family.handle}"
          + (" (the capture's own run)" if first is not None else ""))
    real_init = cuda_graph_pool.GraphFamily.__init__

    def new_family(self: Any, device: int, handle: Any) -> None:
        real_init(self, device, handle)
        lines.append((*_where(), "-", "new pool", str(handle)))

    cuda_graph_pool.GraphFamily.__init__ = new_family


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bart")
    ap.add_argument("--mode", choices=["train", "infer"], default="train")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--replays", action="store_true", help="print replays too (a line per graph call)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_graph_timeline needs a CUDA device", file=sys.stderr)
        return 2
    lines: list[Line] = []
    record(lines)
    train = args.mode == "train"
    case = build(args.model, "gpu")
    module, inputs = placed(case, train, "cuda")
    compiled = torch.compile(module, backend="fuselens", options={"cuda_graphs": True})
    step = make_step(case, compiled, inputs, train, "cuda")
    for i in range(args.steps):
        lines.append(("====", f"step {i + 1}"))
        step()
        torch.cuda.synchronize()
        held = ", ".join(f"{p['pool']} {p['reserved_mb']:.0f} / {p['allocated_mb']:.0f}" for p in pools())
        lines.append(("pools (MB reserved / allocated):", held))
    for line in lines:
        if args.replays or line[3:4] != ("replay",):
            print(*line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
