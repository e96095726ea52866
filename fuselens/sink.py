"""Where producers (the capture hooks, the compiler) hand events over.

The worker installs a listener that streams each event to the parent; a
program using the fuselens backend without the worker can collect them with
`collect()`. Producers call `emit` and never know who listens.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

Listener = Callable[[Any], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def emit(event: Any) -> None:
    """Hand one schema event (a dataclass of fuselens.events) to every listener."""
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(event)


def add_listener(listener: Listener) -> None:
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


_flushers: list[Callable[[], None]] = []


def add_flusher(flusher: Callable[[], None]) -> None:
    """Register a producer that batches events (kernel timings: one event per
    kernel call would flood the pipe). `flush()` asks each to emit what it
    accumulated since the last flush."""
    with _lock:
        if flusher not in _flushers:
            _flushers.append(flusher)


def flush() -> None:
    """Called by the worker periodically and before it exits."""
    with _lock:
        flushers = list(_flushers)
    for flusher in flushers:
        flusher()


@contextlib.contextmanager
def collect() -> Iterator[list[Any]]:
    """Collect every event emitted inside the block into a list."""
    events: list[Any] = []
    add_listener(events.append)
    try:
        yield events
    finally:
        remove_listener(events.append)
