"""SpecPrefill settings: server-wide flags and their per-request overrides.

Server flags (``mlxcore_addoption``) set the defaults; a request may override them
with a body field ``"specprefill": {"enabled": ..., "keep": ..., "threshold": ...,
"chunk": ...}`` (or ``"specprefill": false`` / ``true`` as a shorthand for
``enabled``). Bad values raise ``OptionError("specprefill.<field>", message)``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import attrs

from mlxcore.config import ServerConfig
from mlxcore.errors import OptionError
from mlxcore.settings import add_flags, flag_names, flag_of, read_settings, setting

FIELD = "specprefill"
"""The request-body field holding per-request overrides."""

PREFIX = "specprefill_"
"""Before each field name in the parsed options (``--specprefill-keep`` -> ``specprefill_keep``)."""


@attrs.frozen
class Settings:
    """The effective SpecPrefill settings for one request; the fields with a flag are
    the server-wide defaults, and (except the draft model) what a request may override.

    Attributes:
        draft_model: the draft model's path (server-wide only).
        enabled: apply sparse prefill at all.
        threshold: uncached prompt tokens below which it never applies.
        keep: fraction of the uncached prompt tokens to prefill, in (0, 1].
        chunk: selection granularity in tokens (whole chunks are kept or dropped).
        lookahead: how many final prompt positions of the draft score the prompt.
        decode: how many tokens the draft generates after the prompt whose attention
            also scores it (only with trimmable draft caches; 0 turns it off).
        tail: the last prompt tokens always kept (rounded up to whole chunks).
    """

    draft_model: str | None = setting(
        None, metavar="PATH",
        help="draft model sharing the target's tokenizer, used to score prompt tokens "
        "(required unless --no-specprefill-enabled)",
    )  # fmt: skip
    enabled: bool = setting(
        True, action=argparse.BooleanOptionalAction,
        help='apply SpecPrefill by default (requests can override with "specprefill": '
        '{"enabled": ...})',
    )  # fmt: skip
    threshold: int = setting(
        8192, type=int, metavar="TOKENS",
        help="uncached prompt tokens below which it never applies (default %(default)s)",
    )  # fmt: skip
    keep: float = setting(
        0.2, type=float, metavar="FRACTION",
        help="fraction of prompt tokens to prefill, in (0, 1] (default %(default)s)",
    )  # fmt: skip
    chunk: int = setting(
        32, type=int, metavar="TOKENS",
        help="selection chunk size in tokens (default %(default)s)",
    )  # fmt: skip
    lookahead: int = 8
    decode: int = 8
    tail: int = 64


def add_options(parser: Any) -> None:
    """The plugin's command-line flags, generated from :class:`Settings`."""
    add_flags(parser, Settings, prefix=PREFIX)


FLAGS = {
    field.name: flag_names(field, PREFIX)[0]
    for field in attrs.fields(Settings)
    if flag_of(field) is not None and field.name != "draft_model"
}
"""The fields a request may override, with the flag that sets their server default."""


def server_settings(config: ServerConfig) -> Settings:
    """The server-wide defaults from the parsed flags (raises ``OptionError`` when bad)."""
    read = read_settings(config, Settings, prefix=PREFIX)
    return _validated(attrs.evolve(Settings(), draft_model=read.draft_model), attrs.asdict(read))


def request_settings(base: Settings, options: Mapping[str, Any]) -> Settings:
    """``base`` overridden by the request's ``"specprefill"`` field, if any."""
    raw = options.get(FIELD)
    if raw is None:
        return base
    if isinstance(raw, bool):
        return attrs.evolve(base, enabled=raw)
    if not isinstance(raw, Mapping):
        raise OptionError(FIELD, "must be an object (or true/false)")
    unknown = sorted(set(raw) - set(FLAGS))
    if unknown:
        raise OptionError(
            f"{FIELD}.{unknown[0]}", f"unknown option; known: {', '.join(sorted(FLAGS))}"
        )
    return _validated(base, dict(raw))


def _validated(base: Settings, values: Mapping[str, Any]) -> Settings:
    changes: dict[str, Any] = {}
    if "enabled" in values:
        enabled = values["enabled"]
        if not isinstance(enabled, bool):
            raise OptionError(f"{FIELD}.enabled", "must be true or false")
        changes["enabled"] = enabled
    if "keep" in values:
        keep = values["keep"]
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
            raise OptionError(f"{FIELD}.keep", f"must be a number in (0, 1], got {keep!r}")
        changes["keep"] = float(keep)
    for name, low in (("threshold", 0), ("chunk", 1)):
        if name in values:
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise OptionError(f"{FIELD}.{name}", f"must be an integer >= {low}, got {value!r}")
            changes[name] = value
    return attrs.evolve(base, **changes)
