"""Worker side: torch.distributed collectives as the profiler timed them.

A collective shows twice in a CPU profile: the c10d op that enqueues it
(`c10d::allreduce_`, microseconds) and the backend's work that moves the
data (`gloo:all_reduce`, `nccl:all_reduce`), whose time is what the rank
spent communicating or waiting for its peers. The work events are the ones
reported, one `Kernel` of kind "collective" per name, outside any graph.
"""

from __future__ import annotations

from typing import Any, Iterable

from fuselens.events import Kernel

# Prefixes of the process-group backends' work events (record_function names).
_WORK_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:")


def collective_kernels(events: Iterable[Any]) -> list[Kernel]:
    """One Kernel per collective name with its calls and total time (us),
    from `torch.profiler.profile().events()`."""
    totals: dict[str, list[float]] = {}
    for event in events:
        name = getattr(event, "name", "")
        if not name.startswith(_WORK_PREFIXES):
            continue
        total = totals.setdefault(name, [0, 0.0])
        total[0] += 1
        total[1] += float(getattr(event, "cpu_time_total", 0.0) or 0.0)
    return [
        Kernel(
            name=name,
            kind="collective",
            backend=name.split(":", 1)[0],
            ops=[name.split(":", 1)[1]],
            source=f"{name} (process group work; includes waiting for the slowest rank)",
            calls=int(calls),
            total_time_us=round(us, 3),
        )
        for name, (calls, us) in sorted(totals.items())
    ]
