"""SpecPrefill settings: server-wide flags and their per-request overrides.

Server flags (``mlxcore_addoption``) set the defaults; a request may override them
with a body field ``"specprefill": {"enabled": ..., "keep": ..., "threshold": ...,
"chunk": ...}`` (or ``"specprefill": false`` / ``true`` as a shorthand for
``enabled``). Bad values raise ``ValueError("specprefill.<field>", message)``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import attrs

from mlxcore.config import ServerConfig

FIELD = "specprefill"
"""The request-body field holding per-request overrides."""

DEFAULT_THRESHOLD = 8192
DEFAULT_KEEP = 0.2
DEFAULT_CHUNK = 32
DEFAULT_LOOKAHEAD = 8
DEFAULT_DECODE = 8
DEFAULT_TAIL = 64


@attrs.frozen
class Settings:
    """The effective SpecPrefill settings for one request.

    Attributes:
        enabled: apply sparse prefill at all.
        threshold: uncached prompt tokens below which it never applies.
        keep: fraction of the uncached prompt tokens to prefill, in (0, 1].
        chunk: selection granularity in tokens (whole chunks are kept or dropped).
        lookahead: how many final prompt positions of the draft score the prompt.
        decode: how many tokens the draft generates after the prompt whose attention
            also scores it (only with trimmable draft caches; 0 turns it off).
        tail: the last prompt tokens always kept (rounded up to whole chunks).
    """

    enabled: bool = True
    threshold: int = DEFAULT_THRESHOLD
    keep: float = DEFAULT_KEEP
    chunk: int = DEFAULT_CHUNK
    lookahead: int = DEFAULT_LOOKAHEAD
    decode: int = DEFAULT_DECODE
    tail: int = DEFAULT_TAIL


def add_options(parser: Any) -> None:
    """The plugin's command-line flags."""
    parser.add_argument(
        "--specprefill-draft-model",
        metavar="PATH",
        default=None,
        help="draft model sharing the target's tokenizer, used to score prompt tokens "
        "(required unless --no-specprefill-enabled)",
    )
    parser.add_argument(
        "--specprefill-enabled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="apply SpecPrefill by default (requests can override with "
        '"specprefill": {"enabled": ...})',
    )
    parser.add_argument(
        "--specprefill-threshold",
        type=int,
        default=DEFAULT_THRESHOLD,
        metavar="TOKENS",
        help=f"uncached prompt tokens below which it never applies (default {DEFAULT_THRESHOLD})",
    )
    parser.add_argument(
        "--specprefill-keep",
        type=float,
        default=DEFAULT_KEEP,
        metavar="FRACTION",
        help=f"fraction of prompt tokens to prefill, in (0, 1] (default {DEFAULT_KEEP})",
    )
    parser.add_argument(
        "--specprefill-chunk",
        type=int,
        default=DEFAULT_CHUNK,
        metavar="TOKENS",
        help=f"selection chunk size in tokens (default {DEFAULT_CHUNK})",
    )


FLAGS = {
    "enabled": "--specprefill-enabled",
    "threshold": "--specprefill-threshold",
    "keep": "--specprefill-keep",
    "chunk": "--specprefill-chunk",
}


def server_settings(config: ServerConfig) -> Settings:
    """The server-wide defaults from the parsed flags (raises ``ValueError`` when bad)."""
    return _validated(
        Settings(),
        {
            "enabled": config.option("specprefill_enabled", True),
            "threshold": config.option("specprefill_threshold", DEFAULT_THRESHOLD),
            "keep": config.option("specprefill_keep", DEFAULT_KEEP),
            "chunk": config.option("specprefill_chunk", DEFAULT_CHUNK),
        },
    )


def request_settings(base: Settings, options: Mapping[str, Any]) -> Settings:
    """``base`` overridden by the request's ``"specprefill"`` field, if any."""
    raw = options.get(FIELD)
    if raw is None:
        return base
    if isinstance(raw, bool):
        return attrs.evolve(base, enabled=raw)
    if not isinstance(raw, Mapping):
        raise ValueError(FIELD, "must be an object (or true/false)")
    unknown = sorted(set(raw) - set(FLAGS))
    if unknown:
        raise ValueError(
            f"{FIELD}.{unknown[0]}", f"unknown option; known: {', '.join(sorted(FLAGS))}"
        )
    return _validated(base, dict(raw))


def _validated(base: Settings, values: Mapping[str, Any]) -> Settings:
    changes: dict[str, Any] = {}
    if "enabled" in values:
        enabled = values["enabled"]
        if not isinstance(enabled, bool):
            raise ValueError(f"{FIELD}.enabled", "must be true or false")
        changes["enabled"] = enabled
    if "keep" in values:
        keep = values["keep"]
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep <= 1:
            raise ValueError(f"{FIELD}.keep", f"must be a number in (0, 1], got {keep!r}")
        changes["keep"] = float(keep)
    for name, low in (("threshold", 0), ("chunk", 1)):
        if name in values:
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{FIELD}.{name}", f"must be an integer >= {low}, got {value!r}")
            changes[name] = value
    return attrs.evolve(base, **changes)
