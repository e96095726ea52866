"""AOTAutograd's printouts of a training graph, skipped when nothing reads them.

AOTAutograd (torch 2.11-2.13) prints the joint graph and the forward and backward
graphs it partitions into (`GraphModule.print_readable`) on every training compile,
for its loggers and the structured trace, and keeps the text for its cache entry. The
printing is eager: ResNet-50's training step spent 1.15 of a 33 s profiled first call
there (3.5%, as much on BERT), while no logger was on and no cache entry was made
(the cache serves Inductor's compiles, not other backends').

Around our `aot_module_simplified` call the two printing steps return no text when
neither their loggers (`TORCH_LOGS=aot_graphs,aot_joint_graph`) nor the structured
trace (`TORCH_TRACE`) would take it; with either on, they print as before.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator

_lock = threading.Lock()
_depth = 0
_saved: dict[str, Any] = {}
# the printing steps, with what each returns in place of the text it would have printed
_SKIPPED: dict[str, Any] = {"_log_joint_graph": None, "_log_fw_bw_graphs": (None, None)}


def _graph_compile() -> Any:
    from torch._functorch._aot_autograd import graph_compile

    return graph_compile


def someone_reads() -> bool:
    """Whether AOTAutograd's graph printouts have a reader: its graph loggers at INFO
    or a handler of the structured trace. torch installs its lazy trace handler with no
    directory when TORCH_TRACE is unset; outside Meta's cluster it drops itself at the
    first record without writing it, so it reads nothing."""
    from torch._logging import _internal

    gc_mod = _graph_compile()
    lazy = getattr(_internal, "LazyTraceHandler", ())
    handlers = getattr(getattr(_internal, "trace_log", None), "handlers", [])
    if any(not (isinstance(h, lazy) and getattr(h, "root_dir", None) is None and getattr(h, "stream", None) is None)
           for h in handlers):
        return True
    return any(getattr(gc_mod, name, None) is not None and getattr(gc_mod, name).isEnabledFor(logging.INFO)
               for name in ("aot_joint_log", "aot_graphs_log"))


def _skip(name: str, original: Any) -> Any:
    result = _SKIPPED[name]

    def skipped(*args: Any, **kwargs: Any) -> Any:
        if someone_reads():  # a logger turned on during the compile
            return original(*args, **kwargs)
        return result

    return skipped


@contextlib.contextmanager
def skipped_when_unread() -> Iterator[None]:
    """AOTAutograd's graph printouts skipped inside the block, unless read."""
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1:
            gc_mod = _graph_compile()
            for name in _SKIPPED:
                original = getattr(gc_mod, name, None)
                if original is not None:  # another torch: it prints as it does
                    _saved[name] = original
                    setattr(gc_mod, name, _skip(name, original))
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc_mod = _graph_compile()
                for name, original in _saved.items():
                    setattr(gc_mod, name, original)
                _saved.clear()
