"""Built-in plugin: the flags every speculative decoder shares, and the per-request
``"speculative": false`` option (the settings themselves:
:mod:`mlxcore.speculative.settings`).
"""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import OptionError, UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.settings import add_flags
from mlxcore.speculative.settings import (
    SPECULATIVE_OPTION,
    SpeculativeSettings,
    speculative_settings,
)


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """The shared speculative-decoding flags."""
    add_flags(parser, SpeculativeSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the values also when set without the command line."""
    settings = speculative_settings(config)
    for field in ("num_speculative_tokens", "speculative_disable_by_batch_size"):
        value = getattr(settings, field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"--{field.replace('_', '-')} must be an integer >= 1, got {value!r}")


@hookimpl
def mlxcore_request_options() -> list[str]:
    """``"speculative"``: false turns speculative decoding off for one request."""
    return [SPECULATIVE_OPTION]


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """``"speculative"`` must be a boolean."""
    value = options.get(SPECULATIVE_OPTION)
    if value is not None and not isinstance(value, bool):
        raise OptionError(SPECULATIVE_OPTION, "must be true or false")
