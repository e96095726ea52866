"""Dataclasses <-> plain JSON data (dicts, lists, scalars): one cattrs converter
for the event schema, targets, run options and the server's settings.

Structuring checks types instead of coercing them (cattrs' default turns "yes"
into True for a bool and 5 into "5" for a str): a value of the wrong type is an
error with a message a user can act on. Missing keys take the field's default;
unknown keys are ignored, so an older reader loads a newer minor addition.

Torch-free: the server and the TUI import it through fuselens.events.
"""

from __future__ import annotations

import typing
from typing import Any, Callable, TypeVar

import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, is_mutable_sequence, is_sequence, list_structure_factory

T = TypeVar("T")

# What each scalar type accepts, and how a message names it.
_SCALARS: dict[type, tuple[tuple[type, ...], str]] = {
    str: ((str,), "a string"),
    bool: ((bool,), "true or false"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
}


def _scalar(kind: type) -> Callable[[Any, type], Any]:
    accepted, described = _SCALARS[kind]

    def structure(value: Any, _: type) -> Any:
        if not isinstance(value, accepted) or (isinstance(value, bool) and kind is not bool):
            raise TypeError(f"{value!r} is not {described}")
        return kind(value)

    return structure


def _array(kind: Any, conv: cattrs.Converter) -> Callable[[Any, type], Any]:
    """cattrs' own list/tuple hook, behind a check that the value is a JSON
    array: a string or a dict would otherwise be iterated into its characters
    or keys."""
    factory = list_structure_factory if is_mutable_sequence(kind) else homogenous_tuple_structure_factory
    inner = factory(kind, conv)

    def structure(value: Any, type_: type) -> Any:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{value!r} is not a list")
        return inner(value, type_)

    return structure


def _open_choice(kind: Any) -> Callable[[Any, type], Any]:
    """A Literal names the values this fuselens knows; a newer writer may add
    one without a schema bump (docs/events.md: kernel kind `collective`, error
    kind `divergence`), so any value of the same type loads."""
    accepted = tuple({type(choice) for choice in typing.get_args(kind)})
    described = " or ".join(repr(choice) for choice in typing.get_args(kind))

    def structure(value: Any, _: type) -> Any:
        if not isinstance(value, accepted):
            raise TypeError(f"{value!r} is not {described}")
        return value

    return structure


def _closed_choice(kind: Any) -> Callable[[Any, type], Any]:
    choices = typing.get_args(kind)

    def structure(value: Any, _: type) -> Any:
        if value not in choices:
            raise ValueError(f"{value!r} is not one of " + ", ".join(repr(c) for c in choices))
        return value

    return structure


def _is_literal(kind: Any) -> bool:
    return typing.get_origin(kind) is typing.Literal


def _is_array(kind: Any) -> bool:
    return is_sequence(kind) and kind is not str


converter = cattrs.Converter()
for _kind in _SCALARS:
    converter.register_structure_hook(_kind, _scalar(_kind))
converter.register_structure_hook_factory(_is_array, _array)
converter.register_structure_hook_factory(_is_literal, _open_choice)

# What a person typed (the editor's settings): a value outside a Literal's
# choices is a mistake to tell, not a newer writer's addition.
user_input = converter.copy()
user_input.register_structure_hook_factory(_is_literal, _closed_choice)


def to_data(obj: Any) -> Any:
    """A dataclass (or a list or dict of them) as plain JSON-able data,
    fields in declaration order."""
    return converter.unstructure(obj)


def from_data(kind: type[T], data: Any) -> T:
    """`data` (as `to_data` wrote it) back into `kind`; raises ValueError
    naming each bad value and where it is."""
    try:
        return converter.structure(data, kind)
    except cattrs.BaseValidationError as exc:
        raise ValueError("; ".join(cattrs.transform_error(exc, path=kind.__name__))) from None
