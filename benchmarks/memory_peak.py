"""What is alive at a step's peak GPU memory, for each backend (CUDA only).

    python -m benchmarks.memory_peak --models resnet50 --modes infer
    python -m benchmarks.memory_peak --models bert,resnet50 --modes train --out DIR

Each backend compiles and runs the step of `benchmarks.models` (same models, same
inputs) twice, then once more, all under the CUDA allocator's history
(`torch.cuda.memory._record_memory_history`, started before the compile).
Replaying the last step's part of that history, from what was alive before it,
gives the moment of the step's peak in requested bytes (what the program asked
for; `max_memory_allocated`, also reported, counts the allocator's blocks, up to
1 MB larger each) and every allocation alive then; those the step made are grouped
by the innermost Python frame that is not torch's own (a line of a generated
wrapper, a model's forward), largest first. Two backends' peaks then differ by
named lines, not by a number: each backend after the first is also shown by the
allocation sizes alive at its peak more or fewer times than at the first's. What
each holds from one step to the next (constants, caches, workspaces: memory that
counts in every step's peak) is compared the same way, by the line that allocated
it. The step also records what autograd saved for the backward (each storage
once), which is where two partitions of a training graph differ, and, after it, what
only Python's cycle collector frees (`cyclic_garbage`): memory a reference cycle keeps
from one step into the next, with the collector's settings.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import linecache
import sys
import traceback
import types
from pathlib import Path
from typing import Any, Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.fresh_caches import use_fresh_compile_caches  # noqa: E402

use_fresh_compile_caches("fl_memory_peak_")

import torch  # noqa: E402

import fuselens.compiler  # noqa: E402
fuselens.compiler.register()
from benchmarks.models import make_step, placed  # noqa: E402
from benchmarks.real_models import build  # noqa: E402

_HISTORY_ENTRIES = 2_000_000  # the compile's allocations and three steps', without the ring wrapping
_LIBRARY = ("/torch/", "/site-packages/torch", "/contextlib.py", "/functools.py", "/benchmarks/memory_peak.py")


def _where(frames: list[dict]) -> str:
    """The innermost frame that is not torch's own or this script's (innermost first)."""
    for f in frames:
        name = f.get("filename", "")
        if name and not any(part in name for part in _LIBRARY) and not name.startswith("??"):
            text = linecache.getline(name, int(f.get("line") or 0)).strip()  # generated wrappers are in linecache
            return f"{Path(name).name}:{f.get('line')} {f.get('name')}: {text[:160]}"
    return "(torch internals)"


class Peak(NamedTuple):
    """A step's peak, replayed from the allocator's history."""

    bytes: int  # requested bytes alive at the peak, what was alive before the step included
    groups: list[dict]  # the allocations alive then, by the line that made them, largest first
    alive: list[tuple[int, str]]  # each allocation alive then: (bytes, the line that made it)
    where: str  # the line whose allocation reached the peak
    at: float  # how far into the step's allocations the peak came (0: first, 1: last)


def live_at_peak(trace: list[dict], held: dict[int, tuple[int, str]]) -> Peak:
    """The step's peak in requested bytes (what the program asked for, not the
    allocator's rounded blocks) and what is alive at it; `held` is what was alive
    before the step, by address (the step frees some of it: last step's gradients)."""
    live = dict(held)
    cur = peak = sum(size for size, _ in held.values())
    at_peak = dict(live)
    peak_where, peak_i, allocs = "", 0, 0
    for ev in trace:
        action, addr, size = ev.get("action"), ev.get("addr"), ev.get("size", 0)
        if action == "alloc":
            live[addr] = (size, _where(ev.get("frames", [])))
            cur += size
            allocs += 1
            if cur > peak:
                peak, at_peak, peak_where, peak_i = cur, dict(live), live[addr][1], allocs
        elif action in ("free_requested", "free") and addr in live:
            cur -= live.pop(addr)[0]
    made_in_step = {a: v for a, v in at_peak.items() if a not in held}
    groups: dict[str, list[int]] = {}
    for size, where in made_in_step.values():
        g = groups.setdefault(where, [0, 0])
        g[0] += size
        g[1] += 1
    rows = [{"where": w, "mb": round(b / 2**20, 1), "count": n} for w, (b, n) in groups.items()]
    rows.sort(key=lambda r: -r["mb"])
    return Peak(peak, rows, sorted(at_peak.values(), reverse=True), peak_where, peak_i / max(allocs, 1))


def size_difference(a: list[tuple[int, str]], b: list[tuple[int, str]]) -> list[dict]:
    """Allocation sizes alive at `b`'s peak more (or fewer) times than at `a`'s, with the
    lines that made `b`'s extra ones: two backends that save the same activations differ
    only here, even where their names and groupings do not match."""
    count_a: dict[int, int] = {}
    for size, _ in a:
        count_a[size] = count_a.get(size, 0) + 1
    count_b: dict[int, list[str]] = {}
    for size, where in b:
        count_b.setdefault(size, []).append(where)
    rows = []
    for size in sorted(set(count_a) | set(count_b), reverse=True):
        extra = len(count_b.get(size, [])) - count_a.get(size, 0)
        if extra:
            rows.append({"bytes": size, "extra": extra, "mb": round(extra * size / 2**20, 1),
                         "lines": sorted(set(count_b.get(size, [])))[:4] if extra > 0 else []})
    rows.sort(key=lambda r: -abs(r["mb"]))
    return rows


def measure(name: str, mode: str, backend: str) -> dict:
    train = mode == "train"
    case = build(name, "gpu")
    module, inputs = placed(case, train, "cuda")
    torch._dynamo.reset()
    for k in [k for k in linecache.cache if k.startswith("<fuselens-wrapper")]:
        del linecache.cache[k]  # the wrappers of this measurement only, in the JSON
    kw: dict[str, Any] = {"backend": "fuselens"} if backend == "fuselens" else {}
    device = torch.cuda.current_device()
    with _allocator_history():
        compiled = module if backend == "eager" else torch.compile(module, **kw)
        step = make_step(case, compiled, inputs, train, "cuda")
        for _ in range(2):
            step()
        torch.cuda.synchronize()
        pre = torch.cuda.memory._snapshot()
        mark = len(pre["device_traces"][device])  # the measured step's events start here
        held_by_address = held_blocks(pre, device)
        held = sorted(held_by_address.values(), reverse=True)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        saved: dict[int, tuple[tuple, str, int]] = {}  # storage -> (shape, dtype, bytes) of what autograd saved

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.is_cuda:
                st = t.untyped_storage()
                saved[st.data_ptr()] = (tuple(t.shape), str(t.dtype).replace("torch.", ""), st.nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        trace = snap["device_traces"][device]
        if len(trace) >= _HISTORY_ENTRIES:
            raise RuntimeError("the allocator's history wrapped: raise _HISTORY_ENTRIES")
        trace = trace[mark:]
        p = live_at_peak(trace, held_by_address)
    collector = {"enabled": gc.isenabled(), "thresholds": list(gc.get_threshold()), "frozen": gc.get_freeze_count(),
                 "passes": [st["collections"] for st in gc.get_stats()]}  # since the process began, per generation
    cycles = cyclic_garbage()
    wrappers = {k: "".join(v[2]) for k, v in linecache.cache.items() if k.startswith("<fuselens-wrapper")}
    return {"model": name, "mode": mode, "backend": backend, "peak_mb": round(p.bytes / 2**20, 1), "wrappers": wrappers,
            "allocator_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
            "before_step_mb": round(before / 2**20, 1), "peak_where": p.where, "peak_at": round(p.at, 3),
            "live_at_peak": p.groups[:25], "alive": p.alive, "held": held,
            # what the backward reads, each storage once: two backends' partitions compared
            "saved_mb": round(sum(b for _, _, b in saved.values()) / 2**20, 1), "saved_storages": len(saved),
            "saved_by_shape": _by_shape(saved.values()), "collector": collector, "cycles": cycles}


def cyclic_garbage() -> dict:
    """What only Python's cycle collector would free after the step: the CUDA bytes it
    holds, what the cycles are made of (object types; frames and functions by their
    code) and, for the largest tensors, the chains of objects that hold them. Memory
    alive between steps that a `gc.collect()` frees counts in the next step's peak
    until a full collection happens to run (BART training's logits, 785 MB, H200,
    forty-first session)."""
    gc.set_debug(gc.DEBUG_SAVEALL)  # unreachable objects kept in gc.garbage, to be looked at
    try:
        gc.collect()
        garbage = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(0)
    storages: dict[int, int] = {}
    tensors: list[tuple[int, Any]] = []
    kinds: collections.Counter = collections.Counter()
    code: collections.Counter = collections.Counter()
    errors: collections.Counter = collections.Counter()
    for o in garbage:
        t = type(o)  # not isinstance: a dead weakref.proxy raises on __class__
        if issubclass(t, BaseException):
            tb, last = o.__traceback__, ""
            while tb is not None:  # where it was raised
                last = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno} {tb.tb_frame.f_code.co_name}"
                tb = tb.tb_next
            errors[f"{t.__qualname__}: {str(o)[:120]!r} raised at {last}"] += 1
        kinds[f"{t.__module__}.{t.__qualname__}"] += 1
        if issubclass(t, torch.Tensor):
            try:
                if o.is_cuda:
                    st = o.untyped_storage()
                    storages[st.data_ptr()] = st.nbytes()
                    tensors.append((st.nbytes(), o))
            except RuntimeError:  # a compile's fake tensor: no memory
                pass
        elif t is types.FrameType:
            code[f"frame {o.f_code.co_name} {Path(o.f_code.co_filename).name}:{o.f_lineno}"] += 1
        elif t is types.FunctionType:
            code[f"function {o.__qualname__} {Path(o.__code__.co_filename).name}"] += 1
    tensors.sort(key=lambda p: -p[0])
    holders = [{"mb": round(n / 2**20, 1), "shape": list(x.shape), "chains": _holder_chains(x, garbage)}
               for n, x in tensors[:4]]
    del garbage, tensors
    gc.collect()
    return {"cuda_mb": round(sum(storages.values()) / 2**20, 1), "tensors": len(storages),
            "types": kinds.most_common(25), "code": code.most_common(25), "errors": errors.most_common(10),
            "holders": holders}


def _describe(o: Any, child: Any) -> str:
    """One link of a holder chain: the object, and how it refers to `child`."""
    t = type(o)
    name = f"{t.__module__}.{t.__qualname__}"
    try:
        if t is dict:
            keys = [k for k, v in o.items() if v is child][:2]
            return f"dict[{', '.join(repr(k)[:60] for k in keys)}]"
        if t in (list, tuple):
            return f"{t.__name__}[{next((i for i, v in enumerate(o) if v is child), '?')}] of {len(o)}"
        if t is types.FrameType:
            return f"frame {o.f_code.co_name} {Path(o.f_code.co_filename).name}:{o.f_lineno}"
        if t is types.FunctionType:
            return f"function {o.__qualname__} {Path(o.__code__.co_filename).name}"
        if t is types.CellType:
            return "cell"
        if t is types.MethodType:
            return f"method {o.__func__.__qualname__}"
    except ReferenceError:
        pass
    return name


def _holder_chains(target: Any, garbage: list, depth: int = 16, width: int = 2) -> list[list[str]]:
    """Chains of garbage objects that refer to `target`, innermost first, `depth` links
    at most, until a chain meets itself (the cycle) or an object nothing in the garbage
    holds."""
    inside = {id(o) for o in garbage}
    chains: list[list[str]] = []

    def walk(o: Any, chain: list[str], seen: set[int]) -> None:
        if len(chains) >= width:
            return
        refs = [r for r in gc.get_referrers(o) if id(r) in inside]
        if not refs or len(chain) >= depth:
            chains.append(chain)
            return
        for r in refs[:width]:
            link = _describe(r, o)
            if id(r) in seen:
                chains.append(chain + [f"{link} (cycle)"])
            else:
                walk(r, chain + [link], seen | {id(r)})

    walk(target, [], {id(target)})
    return chains


@contextlib.contextmanager
def _allocator_history() -> Iterator[None]:
    """The CUDA allocator's history recorded, with Python stacks, until the block ends."""
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=_HISTORY_ENTRIES)
    try:
        yield
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)


def held_blocks(snapshot: dict, device: int) -> dict[int, tuple[int, str]]:
    """Every allocation alive in `snapshot`, by address: (requested bytes, the line that
    made it); one made before the allocator's history began (the model's parameters)
    has no line."""
    held = {}
    for seg in snapshot["segments"]:
        if seg.get("device", device) != device:
            continue
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated":
                frames = blk.get("frames") or []
                held[blk["address"]] = (blk.get("requested_size") or blk["size"],
                                        _where(frames) if frames else "(before the compile)")
    return held


def _by_shape(saved: Any) -> list[dict]:
    groups: dict[tuple, int] = {}
    for shape, dtype, nbytes in saved:
        groups[(shape, dtype, nbytes)] = groups.get((shape, dtype, nbytes), 0) + 1
    rows = [{"shape": list(k[0]), "dtype": k[1], "bytes": k[2], "count": n} for k, n in groups.items()]
    rows.sort(key=lambda r: -r["bytes"] * r["count"])
    return rows


def main(argv: Any = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--modes", default="infer")
    ap.add_argument("--backends", default="inductor,fuselens")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    results = []
    for m in a.models.split(","):
        for mode in a.modes.split(","):
            first: dict = {}
            for b in a.backends.split(","):
                try:
                    r = measure(m, mode, b)
                except Exception as e:  # noqa: BLE001 - one failing backend must not end the run
                    r = {"model": m, "mode": mode, "backend": b, "error": f"{type(e).__name__}: {e}"[:400],
                         "traceback": traceback.format_exc()[-3000:]}
                    print(r["traceback"], file=sys.stderr)
                results.append(r)
                print(f"\n{m} {mode} {b}: peak {r.get('peak_mb')} MB requested (allocator {r.get('allocator_peak_mb')}, "
                      f"alive before the step {r.get('before_step_mb')}) {r.get('error', '')}", flush=True)
                print(f"  peak reached {r.get('peak_at', 0):.0%} into the step's allocations, by {r.get('peak_where')}")
                print(f"  saved for the backward: {r.get('saved_mb')} MB in {r.get('saved_storages')} storages")
                cyc = r.get("cycles") or {}
                print(f"  freed only by the cycle collector after the step: {cyc.get('cuda_mb')} MB in "
                      f"{cyc.get('tensors')} storages; collector {r.get('collector')}")
                for what, n in (cyc.get("types") or [])[:12] + (cyc.get("code") or [])[:12] + (cyc.get("errors") or []):
                    print(f"      {n:6d}  {what}")
                for h in cyc.get("holders") or []:
                    print(f"    {h['mb']} MB {h['shape']} held by:")
                    for chain in h["chains"]:
                        print("      <- " + " <- ".join(chain))
                for row in r.get("live_at_peak", [])[:15]:
                    print(f"  {row['mb']:9.1f} MB {row['count']:4d}x  {row['where']}", flush=True)
                if first.get("held") is not None and r.get("held") is not None and r is not first:
                    r["held_difference"] = size_difference(first["held"], r["held"])
                    print(f"  held between steps against {first['backend']}'s, by size:")
                    for row in r["held_difference"][:8]:
                        print(f"  {row['mb']:+9.1f} MB {row['extra']:+4d}x {row['bytes']:>11d} B  {' | '.join(row['lines'])[:300]}")
                if first.get("alive") and r.get("alive"):
                    r["difference"] = size_difference(first["alive"], r["alive"])
                    print(f"  alive at the peak against {first['backend']}'s, by size:")
                    for row in r["difference"][:12]:
                        print(f"  {row['mb']:+9.1f} MB {row['extra']:+4d}x {row['bytes']:>11d} B  {' | '.join(row['lines'])[:300]}")
                elif not first:
                    first = r
                torch.cuda.empty_cache()
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "memory_peak.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
