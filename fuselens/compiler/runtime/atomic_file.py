"""Files the compiler writes into caches that other threads and processes read
(generated modules, autotune choices, cubins, precompiled headers)."""

from __future__ import annotations

import os
import tempfile
from typing import Union

from fuselens.private_dirs import private_dir


def write_atomically(path: str, data: Union[str, bytes]) -> None:
    """Write the whole file so a concurrent reader sees the old state or the new file,
    never part of it: a temporary file beside it, then a rename."""
    # Caches hold code we import and load: the folder must be ours alone (private_dirs)
    directory = private_dir(os.path.dirname(path) or ".")
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)
