"""Client settings of the language server, parsed once into a typed object.

Settings arrive from three places, later ones winning: `initializationOptions`,
`workspace/configuration` (section "fuselens") and
`workspace/didChangeConfiguration`. Each may be flat (`{"trusted": true}`),
nested under "fuselens" (`{"fuselens": {"trusted": true}}`) or dotted
(`{"fuselens.trusted": true}`): editors differ in what they send.

Each value is structured into its field's type by the converter for user input
(fuselens/serialize.py: types checked, not coerced; a choice outside the
field's Literal refused). `compilerOptions` (`{"fuselens.compilerOptions":
{"max_fusion_size": 8}}`) are the fuselens compiler's, validated by its options
dataclass like `fuselens report --set`. A bad value of any setting is left out
and said in `Settings.problems`, for the server to show.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Optional

import cattrs

from fuselens.compiler import options as compiler_options  # torch-free
from fuselens.serialize import user_input

RunOn = Literal["save", "open", "manual"]

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


def _expects(text: str, check: Optional[Callable[[Any], bool]] = None) -> dict[str, Any]:
    """Field metadata: what a value must be, in the words of the problem
    message, and what it must hold beyond its type."""
    return {"expects": text, "check": check}


@dataclass
class Settings:
    """What the user configured. `trusted` and `trusted_roots` gate every run of
    user code, per folder (trust.py)."""

    # the client's workspace folders are trusted (VS Code workspace trust)
    trusted: bool = field(default=False, metadata=_expects("true or false"))
    # folders trusted by name (absolute paths), e.g. from a Neovim config
    trusted_roots: tuple[str, ...] = field(default=(), metadata=_expects("a list of folder paths", all))
    run_on: RunOn = field(default="save", metadata=_expects("one of " + ", ".join(map(repr, typing.get_args(RunOn)))))
    inlay_hints: bool = field(default=False, metadata=_expects("true or false"))
    # force a backend; None keeps the program's own
    backend: Optional[str] = field(default=None, metadata=_expects("a backend name"))
    timeout_s: float = field(default=120.0, metadata=_expects("a positive number of seconds", lambda v: v > 0))
    max_calls: Optional[int] = field(
        default=None, metadata=_expects("a positive integer", lambda v: v is None or v > 0)
    )
    # "train.py --steps 2"; overrides [tool.fuselens] entry
    entry: Optional[str] = field(default=None, metadata=_expects('a command line like "train.py --steps 2"'))
    compiler_options: dict[str, Any] = field(default_factory=dict)  # fuselens compiler, for every run
    problems: tuple[str, ...] = ()  # what the last merge left out, one message each

    def merged(self, raw: Any) -> "Settings":
        """A copy with the values of `raw` (any of the accepted shapes) applied.
        A bad value leaves the setting as it was, so that it cannot stop the
        server, and is named in `problems` for the user to fix."""
        values: dict[str, Any] = {}
        problems: list[str] = []
        for key, value in _flatten(raw).items():
            name = _KEYS.get(key)
            if name is None:
                continue  # the client's own settings (interpreter, trace) ride along
            if name == "compiler_options":
                values[name], found = _compiler_options(value)
                problems += found
                continue
            try:
                values[name] = _structure(name, value)
            except (cattrs.BaseValidationError, TypeError, ValueError):
                problems.append(f"fuselens.{key}: {value!r} is not {_FIELDS[name].metadata['expects']}")
        return dataclasses.replace(self, problems=tuple(problems), **values)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
_TYPES = typing.get_type_hints(Settings)


def _structure(name: str, value: Any) -> Any:
    """`value` as the type of field `name`; raises when it is not one."""
    if name == "trusted_roots" and isinstance(value, str):
        value = [value]  # one folder
    elif name in ("backend", "entry") and value == "":
        value = None  # the editor's empty text box: unset
    elif name == "max_calls" and value == 0 and not isinstance(value, bool):
        value = None  # "0: no limit", as the VS Code setting says
    structured = user_input.structure(value, _TYPES[name])
    check = _FIELDS[name].metadata["check"]
    if check is not None and not check(structured):
        raise ValueError(name)
    return structured


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
