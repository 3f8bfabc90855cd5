"""Config dataclasses -> argparse flags: the one place where a field's help, type, range and default become a flag.

Each flag group we add (``--classmate.*``, ``--engine.*``, ``--tinyv.*``, ``--darling.*``, ``--vrcli.*``) is a
dataclass whose fields carry their documentation in ``metadata``:

* ``help``: effect and interactions, written once;
* ``range`` (a :class:`Bound`, on every numeric field; None where any finite value is allowed): the allowed values.
  The flag's help states it, and :func:`field_problem` enforces it for every group at launch (``integration.launch.args``);
* ``default_help`` (optional): how a derived default (a ``None`` field filled in at launch) is computed;
* ``choices``, ``nargs``, ``metavar``: passed to argparse as they are.

The argparse ``type`` and ``nargs`` come from the field's annotation through :data:`ARG_TYPES`, an explicit table of
annotation objects: an annotation missing from it is a ``TypeError`` when the parser is built, never a silent
``str``. Float options parse with :func:`finite_float`: NaN and +-inf are refused when the flag is read (from the
command line or a ``--config`` file), and :func:`refuse_non_finite` gives upstream's float options the same type.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bound:
    """A closed or open interval; ``none_ok`` allows None (the option's "off" / derived default)."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    none_ok: bool = False

    def ok(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def text(self) -> str:
        if self.hi == math.inf:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}" if self.lo != -math.inf else "finite"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"


POSITIVE_INT = Bound(lo=1)
REQUEST_TIMEOUT_S = Bound(lo=1)
"""The time limit of one request to a model server (judge, verifier, classifier): a round trip and a generation. Below
a second the requests time out, every score they give is invalid and the run stops after its first steps (with Ray,
the engines and the models started for nothing)."""


def finite_float(text: str) -> float:
    """argparse type of every float option: a number, never NaN or +-inf (they would pass every ``<``/``>`` check
    or poison every sum downstream)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def not_nan_float(text: str) -> float:
    """argparse type of a float option whose default is infinite (upstream's ``--ckpt.max_mem``): +-inf allowed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"must be a number (inf allowed, NaN not), got {text!r}")
    return value


def refuse_non_finite(parser: argparse.ArgumentParser, allow_inf: tuple[str, ...] = ()) -> None:
    """Give every ``type=float`` option of ``parser`` (ours and upstream's) :func:`finite_float` as its type; the
    dests in ``allow_inf`` (options where an infinite value means "no limit") get :func:`not_nan_float`."""
    for action in parser._actions:
        if action.type is float:
            action.type = not_nan_float if action.dest in allow_inf else finite_float


# annotation (``X | None`` is looked up as ``X``) -> (argparse type, nargs); bool fields are switches (store_true)
ARG_TYPES: dict[Any, tuple[Any, str | None]] = {
    int: (int, None),
    float: (finite_float, None),
    str: (str, None),
    list[int]: (int, "+"),
    list[float]: (finite_float, "+"),
    list[str]: (str, "+"),
}


def _without_none(annotation: Any) -> Any:
    """``X | None`` -> ``X``; any other annotation unchanged."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def arg_type(cls: type, name: str) -> tuple[type, str | None] | None:
    """The argparse ``(type, nargs)`` of field ``name`` of ``cls``; None for a bool switch."""
    annotation = _without_none(typing.get_type_hints(cls)[name])
    if annotation is bool:
        return None
    try:
        return ARG_TYPES[annotation]
    except (KeyError, TypeError):
        raise TypeError(f"{cls.__name__}.{name}: no argparse type for the annotation {annotation!r}; "
                        "add it to config_fields.ARG_TYPES") from None


def field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return " ".join(_value_text(v) for v in value)
    return str(value)


def option_help(f: dataclasses.Field) -> str:
    """The flag's help: the field's ``help``, then its range (when it has one) and its default."""
    meta = f.metadata
    default = meta.get("default_help")
    if default is None:
        default = "unset" if field_default(f) is None else _value_text(field_default(f))
    bound: Bound | None = meta.get("range")
    if bound is None:
        return f"{meta['help']}. Default: {default}."
    unset = " or unset" if bound.none_ok else ""
    return f"{meta['help']}. Must be {bound.text()}{unset}; default: {default}."


def add_dataclass_group(parser: argparse.ArgumentParser, prefix: str, cls: type) -> None:
    """One ``--<prefix>.<field>`` flag per field of the dataclass ``cls``, in an argparse group titled by its
    docstring's first line."""
    group = parser.add_argument_group(f"{prefix} ({cls.__doc__.splitlines()[0]})")
    for f in dataclasses.fields(cls):
        meta = {k: v for k, v in f.metadata.items() if k not in ("help", "range", "default_help")}
        # argparse %-formats help strings ("%(default)s"): a literal % must be doubled
        kwargs: dict[str, Any] = {"default": field_default(f), "help": option_help(f).replace("%", "%%")}
        typed = arg_type(cls, f.name)
        if typed is None:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"], nargs = typed
            if nargs is not None:
                kwargs["nargs"] = nargs
            kwargs.update(meta)  # an explicit nargs (e.g. 2) or metavar wins
        group.add_argument(f"--{prefix}.{f.name}", **kwargs)


def field_problem(prefix: str, cls: type, values: Any) -> str | None:
    """The first value of ``values`` (an object with one attribute per field of ``cls``: a parsed flag group or the
    dataclass itself) that is not a finite number inside its field's ``range``, as one line naming the flag; None
    when all are. Every float field must be finite, with or without a range; lists are checked element-wise."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        annotation = _without_none(hints[f.name])
        if annotation not in (int, float, list[int], list[float]):
            continue
        value = getattr(values, f.name)
        bound: Bound | None = f.metadata.get("range")
        if value is None:
            if bound is not None and not bound.none_ok:
                return f"--{prefix}.{f.name} needs a value ({bound.text()})"
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return f"--{prefix}.{f.name} must be a finite number, got {v!r}"
            if bound is not None and not bound.ok(float(v)):
                return f"--{prefix}.{f.name} must be {bound.text()}, got {v!r}"
    return None


def ranges_of(prefix: str, cls: type) -> dict[str, Bound]:
    """``{"<prefix>.<field>": Bound}`` for every field of ``cls`` with a (not None) ``range``."""
    return {f"{prefix}.{f.name}": f.metadata["range"] for f in dataclasses.fields(cls)
            if f.metadata.get("range") is not None}
