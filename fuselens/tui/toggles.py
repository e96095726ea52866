"""The live toggles: which compiler and backend switches the TUI offers, and
how a toggle state becomes `RunOptions`. Pure data, no Textual, no torch.

The fuselens compiler's toggles come from the `choices`, `label` and `help`
of the CompilerOptions fields (fuselens/compiler/options.py, torch-free).
The Inductor switches are real `torch._inductor.config` names (a test reads
the installed config's source).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional

from fuselens.capture.target import RunOptions
from fuselens.compiler import options as compiler_options

Scope = Literal["run", "fuselens", "inductor"]

# The backend toggle: "program" keeps whatever the program passes to
# torch.compile (RunOptions.backend=None).
PROGRAM_BACKEND = "program"


@dataclass(frozen=True)
class Toggle:
    """One switch. `values` is the cycle order; the first is the default.

    scope "run": the backend itself; "fuselens": a key of
    `RunOptions.compiler_options`; "inductor": a key of
    `RunOptions.inductor_config`. A scoped toggle only applies when that
    backend is selected."""

    name: str
    label: str
    scope: Scope
    values: tuple[Any, ...]
    help: str = ""
    auto: Any = None  # the value that means "let the compiler choose", shown as "auto"

    @property
    def default(self) -> Any:
        return self.values[0]

    @property
    def key(self) -> str:
        """Unique across scopes (both backends have a max_fusion_size)."""
        return f"{self.scope}:{self.name}"


TOGGLES: tuple[Toggle, ...] = (
    Toggle("backend", "backend", "run", (PROGRAM_BACKEND, "fuselens", "inductor", "eager"),
           "the torch.compile backend forced on every compile (program: its own)"),
    # fuselens compiler options: every field of CompilerOptions with choices.
    *(Toggle(f.name, f.metadata["label"], "fuselens", f.metadata["choices"], f.metadata["help"], f.metadata["auto"])
      for f in compiler_options.toggle_fields()),
    # Inductor's own switches (torch._inductor.config).
    Toggle("epilogue_fusion", "epilogue fusion", "inductor", (True, False), "inductor config.epilogue_fusion"),
    Toggle("aggressive_fusion", "aggressive fusion", "inductor", (False, True),
           "inductor config.aggressive_fusion"),
    Toggle("max_fusion_size", "max fusion size", "inductor", (64, 32, 16, 8, 4, 2),
           "inductor config.max_fusion_size"),
    Toggle("pattern_matcher", "pattern matcher", "inductor", (True, False), "inductor config.pattern_matcher"),
    Toggle("max_autotune", "max autotune", "inductor", (False, True), "inductor config.max_autotune"),
    Toggle("triton.cudagraphs", "CUDA graphs", "inductor", (False, True), "inductor config.triton.cudagraphs"),
    Toggle("cpp.threads", "threads", "inductor", (-1, 1, 2, 4, 8), "inductor config.cpp.threads", auto=-1),
    Toggle("cpp_wrapper", "C++ wrapper", "inductor", (False, True), "inductor config.cpp_wrapper"),
    Toggle("fallback_random", "fallback random", "inductor", (False, True), "inductor config.fallback_random"),
)

TOGGLES_BY_KEY = {t.key: t for t in TOGGLES}


def format_value(value: Any, toggle: Optional[Toggle] = None) -> str:
    """How a toggle value reads on screen: on/off, auto, or the value."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value is None or (toggle is not None and toggle.auto is not None and value == toggle.auto):
        return "auto"
    return str(value)


class ToggleState:
    """Current value of every toggle. Mutable; `options()` makes RunOptions."""

    def __init__(self, backend: Optional[str] = None) -> None:
        self.values: dict[str, Any] = {t.key: t.default for t in TOGGLES}
        if backend is not None:
            self.set("run:backend", backend)

    @property
    def backend(self) -> str:
        return self.values["run:backend"]

    def get(self, key: str) -> Any:
        return self.values[key]

    def set(self, key: str, value: Any, any_value: bool = False) -> None:
        """Set `key`; a value outside its cycle only with `any_value` (the caller
        validated it, e.g. `--set max_fusion_size=3`) or for the backend."""
        toggle = TOGGLES_BY_KEY[key]
        if any_value or key == "run:backend" and value not in toggle.values:
            # Any registered backend name may be forced from the command line.
            self.values[key] = value
            return
        if value not in toggle.values:
            raise ValueError(f"{toggle.label}: {value!r} is not one of {toggle.values}")
        self.values[key] = value

    def cycle(self, key: str, step: int = 1) -> Any:
        """Move `key` to its next (step=1) or previous (-1) value; returns it."""
        toggle = TOGGLES_BY_KEY[key]
        values = toggle.values
        current = self.values[key]
        index = values.index(current) if current in values else -1
        self.values[key] = values[(index + step) % len(values)]
        return self.values[key]

    def applies(self, toggle: Toggle) -> bool:
        """Whether `toggle` can change anything under the selected backend
        (with the program's own backend, both compilers' switches apply)."""
        return toggle.scope in ("run", self.backend) or self.backend == PROGRAM_BACKEND and toggle.scope != "run"

    def changed(self, scope: Scope) -> dict[str, Any]:
        """The toggles of `scope` that differ from their default. Only these
        are sent: a default we list must never override the real one."""
        return {
            t.name: self.values[t.key]
            for t in TOGGLES
            if t.scope == scope and self.values[t.key] != t.default
        }

    def describe(self) -> str:
        """One line naming the backend and every non-default switch."""
        parts = [f"backend={self.backend}"]
        parts += [
            f"{t.name}={format_value(self.values[t.key], t)}"
            for t in TOGGLES
            if t.scope != "run" and self.applies(t) and self.values[t.key] != t.default
        ]
        return " ".join(parts)

    def options(self, base: RunOptions) -> RunOptions:
        """`base` with the backend and the switches of this state applied."""
        backend = None if self.backend == PROGRAM_BACKEND else self.backend
        compiler = self.changed("fuselens") if backend in ("fuselens", None) else {}
        inductor = self.changed("inductor") if backend in ("inductor", None) else {}
        return dataclasses.replace(
            base,
            backend=backend,
            compiler_options=({**(base.compiler_options or {}), **compiler} or None),
            inductor_config={**base.inductor_config, **inductor},
        )
