"""Settings written once: a field's default, type, flag and help live on the field.

:class:`mlxcore.config.ServerConfig` and every plugin's settings class are attrs
classes whose fields are declared with :func:`setting`. The command line is
generated from them (:func:`add_flags`), so a flag cannot disagree with its
field, and a plugin reads its values back as a typed object
(:func:`read_settings`) instead of restating each default::

    @attrs.frozen
    class HelloSettings:
        hello_greeting: str = setting("hello", help="what to say")  # --hello-greeting

    @hookimpl
    def mlxcore_addoption(parser):
        add_flags(parser, HelloSettings)

    @hookimpl
    def mlxcore_configure(config):
        settings = read_settings(config, HelloSettings)
"""

from __future__ import annotations

import argparse
import builtins
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import attrs

T = TypeVar("T")
FLAG = "mlxcore_flag"
"""attrs metadata key holding a field's :class:`Flag`."""


@attrs.frozen
class Flag:
    """How a setting appears on the command line (its name comes from the field's:
    :func:`flag_names`)."""

    help: str
    group: str = ""
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    nargs: str | None = None
    action: str | builtins.type[argparse.Action] | None = None
    choices: tuple[Any, ...] | None = None
    aliases: tuple[str, ...] = ()


def setting(
    default: Any,
    *,
    help: str,
    group: str = "",
    type: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    nargs: str | None = None,
    action: str | builtins.type[argparse.Action] | None = None,
    choices: tuple[Any, ...] | None = None,
    converter: Callable[[Any], Any] | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """An attrs field with its command-line flag (``default`` is the one default). The
    flag is the field's name (see :func:`flag_names`); ``aliases`` are further names for
    it, each documented in its ``help`` (a peer's name for the same setting)."""
    meta = Flag(help, group, type, metavar, nargs, action, choices, aliases)
    return attrs.field(default=default, converter=converter, metadata={FLAG: meta})


def flag_of(field: attrs.Attribute[Any]) -> Flag | None:
    """The :class:`Flag` of a settings field, or ``None`` for a field without one."""
    flag = field.metadata.get(FLAG)
    return flag if isinstance(flag, Flag) else None


def flag_names(field: attrs.Attribute[Any], prefix: str = "") -> list[str]:
    """A setting's flags: ``--`` and its ``dest`` (``prefix`` + field name) with dashes
    (``--no-...`` for a ``store_false`` switch), then its aliases."""
    flag = flag_of(field)
    if flag is None:
        return []
    stem = (prefix + field.name).replace("_", "-")
    return ["--no-" + stem if flag.action == "store_false" else "--" + stem, *flag.aliases]


def add_flags(
    parser: Any,
    cls: type[Any],
    *,
    groups: tuple[str, ...] | None = None,
    containers: Mapping[str, Any] | None = None,
    prefix: str = "",
) -> list[str]:
    """Add an argparse flag for each field of ``cls`` declared with :func:`setting`.

    ``groups`` keeps only the fields of those groups; ``containers`` maps a group
    name to the argparse group to add it to (default: ``parser`` itself);
    ``prefix`` goes before each field name to make its ``dest`` (so a plugin's
    short field names do not collide with others' in the parsed options). Returns
    the ``dest`` names added.
    """
    added: list[str] = []
    for field in attrs.fields(cls):
        flag = flag_of(field)
        if flag is None or (groups is not None and flag.group not in groups):
            continue
        target = (containers or {}).get(flag.group, parser)
        kwargs: dict[str, Any] = {
            "dest": prefix + field.name,
            "default": _default(field),
            "help": flag.help,
        }
        for key in ("type", "metavar", "nargs", "action", "choices"):
            value = getattr(flag, key)
            if value is not None:
                kwargs[key] = value
        if flag.action in ("store_true", "store_false"):
            kwargs.pop("metavar", None)
        target.add_argument(*flag_names(field, prefix), **kwargs)
        added.append(prefix + field.name)
    return added


def _default(field: attrs.Attribute[Any]) -> Any:
    default: Any = field.default
    return default.factory() if isinstance(default, attrs.Factory) else default  # type: ignore[arg-type]


def read_settings(config: Any, cls: type[T], *, prefix: str = "") -> T:
    """``cls`` filled from a plugin's parsed options (``config.option(prefix + name)``,
    the ``prefix`` given to :func:`add_flags`); a field the command line did not set
    keeps its declared default."""
    values = {}
    for field in attrs.fields(cast(Any, cls)):
        if flag_of(field) is None:
            continue
        value = config.option(prefix + field.name, attrs.NOTHING)
        if value is not attrs.NOTHING:
            values[field.name] = value
    return cls(**values)


# -- value types for flags ---------------------------------------------------


def positive_int(text: str) -> int:
    """An integer > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def header_value(text: str) -> str:
    """Text that can be an HTTP header's value: 1-128 printable ASCII characters."""
    if not 0 < len(text) <= 128 or not all(" " <= ch <= "~" for ch in text):
        raise argparse.ArgumentTypeError(f"expected 1-128 printable ASCII characters, got {text!r}")
    return text


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def time_share(text: str) -> float:
    """A number from 0 to 8 (decode steps' worth of time)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 8.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 8, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {text!r}")
    return value


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9}
_BYTE_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30})


def byte_size(text: str) -> int:
    """``512MB``, ``2GiB``, ``0`` or a plain number of bytes."""
    value = text.strip().lower()
    number = value.rstrip("kmgib")
    unit = value[len(number) :]
    try:
        size = float(number)
    except ValueError:
        size = -1.0
    if unit not in _BYTE_UNITS or not 0 <= size < 2**50:
        raise argparse.ArgumentTypeError(f"expected a size such as 512MB or 2GiB, got {text!r}")
    return int(size * _BYTE_UNITS[unit])


def json_object(text: str) -> dict[str, Any]:
    """A JSON object, e.g. ``{"enable_thinking": false}``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def log_level(text: str) -> str:
    """A log level name, any case."""
    value = text.strip().lower()
    if value not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid log level {text!r} (choose from {', '.join(LOG_LEVELS)}; any case)"
        )
    return value
