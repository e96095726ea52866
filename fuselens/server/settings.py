"""Client settings of the language server, parsed once into a typed object.

Settings arrive from three places, later ones winning: `initializationOptions`,
`workspace/configuration` (section "fuselens") and
`workspace/didChangeConfiguration`. Each may be flat (`{"trusted": true}`),
nested under "fuselens" (`{"fuselens": {"trusted": true}}`) or dotted
(`{"fuselens.trusted": true}`): editors differ in what they send.

`compilerOptions` (`{"fuselens.compilerOptions": {"max_fusion_size": 8}}`) are the
fuselens compiler's, validated by its options dataclass like `fuselens report
--set`; the bad ones are left out and said in `Settings.problems`, for the server
to show.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from fuselens.compiler import options as compiler_options  # torch-free

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
    "compilerOptions": "compiler_options",
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
    compiler_options: dict[str, Any] = field(default_factory=dict)  # fuselens compiler, for every run
    problems: tuple[str, ...] = ()  # what the last merge left out, one message each

    def merged(self, raw: Any) -> "Settings":
        """A copy with the values of `raw` (any of the accepted shapes) applied.
        Values of the wrong type are ignored, so a bad setting cannot stop the
        server; bad compiler options are also named in `problems`."""
        values = dataclasses.asdict(self)
        values["problems"] = ()
        for key, value in _flatten(raw).items():
            name = _KEYS.get(key)
            if name is None:
                continue
            if name == "compiler_options":
                values[name], values["problems"] = _compiler_options(value)
                continue
            coerced = _coerce(name, value)
            if coerced is not _INVALID:
                values[name] = coerced
        return Settings(**values)


def _compiler_options(raw: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the valid options, a message per bad one)."""
    if raw is None:
        return {}, ()
    if not isinstance(raw, Mapping):
        return {}, (f"fuselens.compilerOptions must be an object of NAME: VALUE, not {raw!r}",)
    good: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in raw.items():
        try:
            good[name] = compiler_options.parse_value(str(name), value)
        except ValueError as exc:
            problems.append(f"fuselens.compilerOptions: {exc}")
    return good, tuple(problems)


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
