"""How an option is declared and checked: :func:`option`, :class:`Options`, :func:`choice`.

An option is a dataclass field with a help text and, for numbers, its range::

    iters: int = option(3, "training iterations", ge=1)
    lr: float = option(3e-3, "AdamW learning rate", gt=0)
    placement: Placement = option(Placement.launch, "where the baselines' ranks run")

:class:`Options` checks every field of a dataclass after it is built (Hydra builds it from the
command line, tests and studies call it directly): a number outside its range, a float that is
not finite, a text that is not one of an enum's choices, or a missing value where the type has
no ``None`` is one :class:`ConfigError` naming the key, the value and the rule. A check that
involves several fields goes in the class's :meth:`Options.check`, which runs after the field
checks.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Iterable
from enum import Enum, StrEnum
from typing import Any, ClassVar

__all__ = [
    "ConfigError",
    "Options",
    "option",
    "group",
    "choice",
    "cpu_cores",
    "describe_type",
]

_MISSING = dataclasses.MISSING


class ConfigError(ValueError):
    """Bad configuration: the message names the key, the value and what is wrong."""


def cpu_cores() -> int:
    """CPU cores this process may use (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def choice(name: str, values: Iterable[str], *, module: str = __name__) -> type[StrEnum]:
    """A :class:`StrEnum` whose members are ``values`` (member name = value), for a choice whose
    values are spelled once elsewhere (``choice("CaseVariant", system.cases.VARIANTS)``)."""
    return StrEnum(name, [(v, v) for v in values], module=module, qualname=name)


def option(
    default: Any = _MISSING,
    help: str = "",
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A dataclass field with its help text and range (a list's bounds hold for each item).

    A list or dict default is copied per instance."""
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def group(cls: type, help: str = "") -> Any:
    """A nested block of options (``limits.*``) of dataclass ``cls``, with its default values."""
    return dataclasses.field(default_factory=cls, metadata={"help": help})


def _strip_optional(tp) -> tuple[Any, bool]:
    """(the type without ``| None``, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        return (args[0] if len(args) == 1 else Any), optional
    return tp, tp is Any


def describe_type(tp) -> str:
    """A type as the help text shows it: ``int``, ``float | null``, ``launch|topology``."""
    base, optional = _strip_optional(tp)
    origin = typing.get_origin(base)
    if origin is list:
        (item,) = typing.get_args(base) or (Any,)
        text = f"list[{describe_type(item)}]"
    elif isinstance(base, type) and issubclass(base, Enum):
        text = "|".join(m.value for m in base)
    elif isinstance(base, type) and dataclasses.is_dataclass(base):
        text = "group"
    else:
        text = getattr(base, "__name__", str(base)).replace("typing.", "")
    return f"{text} | null" if optional and base is not Any else text


def _check_value(key: str, value, tp, meta: dict):
    """``value`` checked against its type's choices and ``meta``'s range; returns it (an enum
    member where the type is an enum)."""
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise ConfigError(
                f"{key}={value!r}: expected one of {', '.join(m.value for m in tp)}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value}: must be a finite number")
    for rule, ok, text in (
        ("ge", lambda b: value >= b, ">="),
        ("gt", lambda b: value > b, ">"),
        ("le", lambda b: value <= b, "<="),
        ("lt", lambda b: value < b, "<"),
    ):
        bound = meta.get(rule)
        if bound is not None and not ok(bound):
            raise ConfigError(f"{key}={value!r}: must be {text} {bound}")
    return value


def check_fields(obj, prefix: str = "") -> None:
    """Check every field of the dataclass ``obj`` (module docstring); enums are converted."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        tp, optional = _strip_optional(hints[f.name])
        if value is None:
            if not optional:
                raise ConfigError(f"{key}=null: a value is required")
            continue
        if dataclasses.is_dataclass(value):
            continue  # a group checks itself
        meta = dict(f.metadata)
        if typing.get_origin(tp) is list and isinstance(value, (list, tuple)):
            (item,) = typing.get_args(tp) or (Any,)
            value = [_check_value(f"{key}[]", v, item, meta) for v in value]
        else:
            value = _check_value(key, value, tp, meta)
        object.__setattr__(obj, f.name, value)


@dataclasses.dataclass
class Options:
    """Base of every options dataclass: field checks (:func:`check_fields`), then
    :meth:`check`. ``KEY`` is the block's key (``"limits"``) in messages, empty at the top."""

    KEY: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self, f"{self.KEY}." if self.KEY else "")
        self.check()

    def check(self) -> None:
        """Checks across fields (a subclass adds its own and calls ``super().check()``)."""
