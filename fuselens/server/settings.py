"""Client settings of the language server, parsed once into a typed object.

Settings arrive from three places, later ones winning: `initializationOptions`,
`workspace/configuration` (section "fuselens") and
`workspace/didChangeConfiguration`. Each may be flat (`{"trusted": true}`),
nested under "fuselens" (`{"fuselens": {"trusted": true}}`) or dotted
(`{"fuselens.trusted": true}`): editors differ in what they send.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

RUN_ON_VALUES = ("save", "open", "manual")

# camelCase keys as editors write them -> Settings field names.
_KEYS = {
    "trusted": "trusted",
    "trustedRoots": "trusted_roots",
    "runOn": "run_on",
    "inlayHints": "inlay_hints",
    "backend": "backend",
    "timeout": "timeout_s",
    "maxCalls": "max_calls",
    "entry": "entry",
}


@dataclass
class Settings:
    """What the user configured. `trusted` and `trusted_roots` gate every run of
    user code, per folder (trust.py)."""

    trusted: bool = False  # the client's workspace folders are trusted (VS Code workspace trust)
    trusted_roots: tuple[str, ...] = ()  # folders trusted by name (absolute paths), e.g. from a Neovim config
    run_on: str = "save"  # save | open | manual
    inlay_hints: bool = False
    backend: Optional[str] = None  # force a backend; None keeps the program's own
    timeout_s: float = 120.0
    max_calls: Optional[int] = None
    entry: Optional[str] = None  # "train.py --steps 2"; overrides [tool.fuselens] entry

    def merged(self, raw: Any) -> "Settings":
        """A copy with the values of `raw` (any of the accepted shapes) applied.
        Values of the wrong type are ignored, so a bad setting cannot stop the
        server."""
        values = dataclasses.asdict(self)
        for key, value in _flatten(raw).items():
            name = _KEYS.get(key)
            if name is None:
                continue
            coerced = _coerce(name, value)
            if coerced is not _INVALID:
                values[name] = coerced
        return Settings(**values)


_INVALID = object()


def _flatten(raw: Any) -> dict[str, Any]:
    """Accept flat, nested-under-"fuselens" and dotted "fuselens.x" forms."""
    if not isinstance(raw, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            continue
        if key == "fuselens" and isinstance(value, Mapping):
            out.update(_flatten(value))
        elif key.startswith("fuselens."):
            out[key[len("fuselens.") :]] = value
        elif key in _KEYS:
            out[key] = value
    return out


def _coerce(name: str, value: Any) -> Any:
    if name == "trusted_roots":
        if isinstance(value, str):
            value = [value]
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value)
        return tuple(value) if ok else _INVALID
    if name in ("trusted", "inlay_hints"):
        return value if isinstance(value, bool) else _INVALID
    if name == "run_on":
        return value if value in RUN_ON_VALUES else _INVALID
    if name in ("backend", "entry"):
        if value in (None, ""):
            return None
        return value if isinstance(value, str) else _INVALID
    if name == "timeout_s":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
        return float(value) if ok else _INVALID
    if name == "max_calls":
        if value is None:
            return None
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return value if ok else _INVALID
    return _INVALID
