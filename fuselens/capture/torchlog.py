"""The base of the worker's readers of torch's log records.

A record fuselens cannot read must never break the user's compile: the
reader counts it in `errors`, and the worker reports the count as one
internal error after the run. No torch.
"""

from __future__ import annotations

import logging


class TorchLogReader(logging.Handler):
    """A handler on one of torch's loggers; subclasses implement `read`."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.errors = 0  # records that raised in `read`

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D401 - logging API
        try:
            self.read(record)
        except Exception:  # never break the user's compile because we misread a record
            self.errors += 1

    def read(self, record: logging.LogRecord) -> None:
        """Take one record into the reader's state, or emit events from it."""
        raise NotImplementedError
