"""Command-line options written once: as fields of an attrs class.

A field made with :func:`option` carries its flag, help, group, unit and argument type in
its metadata; :func:`add_options` turns the fields of a class into argparse options and
:func:`from_args` turns the parsed values back into an instance of the class, so an option
is one field (as vLLM derives its command line from ``EngineArgs``). ``config.Settings`` is
written this way, and so are the options of the commands that start engines.

What a field's default says about its option:

- a bool: a switch; default False is ``--FLAG`` (store true), default True is
  ``--no-FLAG`` (store false; the flag is then given);
- a list: a repeatable option, each value appended;
- an int or float: that type on the command line (a float with a ``unit``: the value is
  given in the unit and stored multiplied by its scale, an int field rounded down);
- a str: a string; an empty default (or ``unset=True``) shows no default and stores the
  field's default when the option is not given.

A command that starts another program may offer some of that program's options as its
own, under a prefix (``trioserve run``'s ``--mock-*`` are the mock engine's): a field
made with ``offered=Offered(...)`` says how, and ``add_options``/``from_args`` given the
prefix read those fields only; :func:`argv_of` writes the program's command line back
from the instance.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

_T = TypeVar("_T")
_Number = TypeVar("_Number", int, float)

#: The metadata key of an option's description.
KEY = "trioserve.option"


@attrs.frozen
class Unit:
    """How a value is written on the command line: its name (the metavar) and how many of
    the field's own units one of it is."""

    name: str
    scale: float = 1


SECONDS = Unit("SECONDS")
MIB = Unit("MiB", 2**20)
KIB = Unit("KiB", 1024)


@attrs.frozen
class Offered:
    """How a command that starts a program offers one of the program's options under a
    prefix: its help there, and its flag when that is not ``--PREFIX`` and the field's
    name."""

    help: str
    flag: str | None = None


@attrs.frozen
class Option:
    """What a field's command-line option is (see the module's docstring)."""

    help: str
    group: str
    flag: str | None = None
    unit: Unit | None = None
    #: The name of an argument type in the table :func:`add_options` is given; None: the
    #: type of the field's default.
    kind: str | None = None
    choices: Sequence[str] | None = None
    metavar: str | None = None
    #: Not given is told apart from given as the default (the option is then None).
    unset: bool = False
    #: The option may be given without a value, which is then this.
    const: Any = None
    #: Offered by a command that starts this program, under a prefix (None: not offered).
    offered: Offered | None = None


def number(kind: type[_Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        return _number(kind, text)

    parse.__name__ = kind.__name__
    return parse


def positive(kind: type[_Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        value = _number(kind, text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def non_negative(kind: type[_Number]) -> Callable[[str], _Number]:
    def parse(text: str) -> _Number:
        value = _number(kind, text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be zero or more, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _number(kind: type[_Number], text: str) -> _Number:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def name(text: str) -> str:
    """A name that must say something (a model's, say): not empty, no surrounding spaces."""
    if not text or text != text.strip():
        raise argparse.ArgumentTypeError(f"expected a name, got {text!r}")
    return text


#: The argument types by the name a field's ``kind`` gives (``Option.kind``; "int" and
#: "float" for a number field without one), each a function of the field's Python type.
BASIC_TYPES: dict[str, Callable[[type], Callable[[str], Any]]] = {
    "int": number,
    "float": number,
    "positive": positive,
    "non_negative": non_negative,
    "name": lambda _kind: name,
}


def option(
    default: Any,
    *,
    help: str,
    group: str,
    flag: str | None = None,
    unit: Unit | None = None,
    kind: str | None = None,
    choices: Sequence[str] | None = None,
    metavar: str | None = None,
    unset: bool = False,
    const: Any = None,
    offered: Offered | None = None,
    repr: bool = True,
) -> Any:
    """An attrs field with a default and the command-line option that sets it."""
    described = Option(help, group, flag, unit, kind, choices, metavar, unset, const, offered)
    if isinstance(default, list):
        return attrs.field(factory=list, metadata={KEY: described}, repr=repr)
    return attrs.field(default=default, metadata={KEY: described}, repr=repr)


def described_fields(cls: type, prefix: str = "") -> list[tuple[attrs.Attribute[Any], Option]]:
    """The fields of ``cls`` that have an option, in their order; with a ``prefix``, those
    offered under it, each described as offered (its flag and help there)."""
    fields = [(f, f.metadata[KEY]) for f in attrs.fields(cls) if KEY in f.metadata]
    if not prefix:
        return fields
    return [
        (field, _as_offered(field, described, described.offered, prefix))
        for field, described in fields
        if described.offered is not None
    ]


def _as_offered(
    field: attrs.Attribute[Any], described: Option, offered: Offered, prefix: str
) -> Option:
    flag = offered.flag or f"--{prefix}{field.name.replace('_', '-')}"
    return attrs.evolve(described, help=offered.help, flag=flag, offered=None)


def flag_of(field: attrs.Attribute[Any], described: Option) -> str:
    return described.flag or f"--{field.name.replace('_', '-')}"


def dest_of(field: attrs.Attribute[Any], described: Option) -> str:
    """Where argparse keeps the value: the flag's name (as argparse would name it), so that
    ``--max-body-mb`` is ``args.max_body_mb``, in MiB; a ``--no-`` switch keeps the field's
    name."""
    if isinstance(_default(field), bool) and _default(field):
        return field.name
    return flag_of(field, described).removeprefix("--").replace("-", "_")


def _default(field: attrs.Attribute[Any]) -> Any:
    default: Any = field.default
    return default.factory() if isinstance(default, attrs.Factory) else default  # type: ignore[arg-type]


def add_options(
    groups: Mapping[str, argparse._ActionsContainer],
    cls: type,
    *,
    types: Mapping[str, Callable[[type], Callable[[str], Any]]],
    prefix: str = "",
) -> None:
    """Add an option for each described field of ``cls`` (with a ``prefix``: each offered
    under it) to the argument group (or parser) ``groups`` maps its ``group`` to. ``types``
    maps a field's ``kind`` (or its type's name, "int" or "float", when it has none) to a
    function of the field's Python type that returns the argparse type. Raises KeyError for
    a group or a kind not in the tables."""
    for field, described in described_fields(cls, prefix):
        group = groups[described.group]
        default = _default(field)
        flag = flag_of(field, described)
        dest = dest_of(field, described)
        if isinstance(default, bool):
            action = "store_false" if default else "store_true"
            group.add_argument(flag, dest=dest, action=action, help=described.help)
            continue
        kwargs: dict[str, Any] = {"dest": dest, "help": described.help}
        if described.choices is not None:
            kwargs["choices"] = list(described.choices)
        value_type: type = str if isinstance(default, list) else type(default)
        shown = default
        if described.unit is not None and described.unit.scale != 1:
            value_type = float
            shown = default / described.unit.scale
        if described.kind is not None:
            kwargs["type"] = types[described.kind](value_type)
        elif value_type is not str:
            kwargs["type"] = types[value_type.__name__](value_type)
        metavar = described.metavar or (described.unit.name if described.unit else None)
        if metavar is not None:
            kwargs["metavar"] = metavar
        if described.const is not None:
            kwargs.update(nargs="?", const=described.const)
        if isinstance(default, list):
            kwargs.update(action="append", default=[])
        elif described.unset or default in ("", None):
            kwargs["default"] = None
        else:
            kwargs["default"] = shown
        group.add_argument(flag, **kwargs)


def from_args(cls: type[_T], args: argparse.Namespace, prefix: str = "", **given: Any) -> _T:
    """An instance of ``cls`` with the values of its options in ``args`` (as
    :func:`add_options` added them, with the same ``prefix``), and ``given`` for the fields
    that are not read from ``args`` as they are; a field not offered under ``prefix`` is its
    default."""
    values: dict[str, Any] = {}
    for field, described in described_fields(cls, prefix):
        if field.name in given:
            continue
        value = getattr(args, dest_of(field, described))
        default = _default(field)
        if value is None:
            continue  # not given: the field's default
        if isinstance(default, list):
            value = list(value)
        elif described.unit is not None and described.unit.scale != 1:
            value = value * described.unit.scale
            if isinstance(default, int):
                value = int(value)
        values[field.name] = value
    return cls(**values, **given)


def argv_of(instance: object) -> list[str]:
    """The command line that gives a program the values of ``instance``, whose class's
    options it parses (:func:`add_options`, then :func:`from_args`, which reads it back
    into an equal instance). A value that is its field's default is left out: an option
    not given is its field's default."""
    argv: list[str] = []
    for field, described in described_fields(type(instance)):
        value = getattr(instance, field.name)
        default = _default(field)
        if value == default:
            continue
        flag = flag_of(field, described)
        if isinstance(default, bool):
            argv.append(flag)  # the switch away from the default
        elif isinstance(default, list):
            for item in value:
                argv += [flag, str(item)]
        elif described.unit is not None and described.unit.scale != 1:
            argv += [flag, repr(value / described.unit.scale)]
        else:
            argv += [flag, str(value)]
    return argv
