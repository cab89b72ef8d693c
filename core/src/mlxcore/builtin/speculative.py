"""Built-in plugin: the settings and the request option every speculative decoder shares.

``--num-speculative-tokens`` and ``--speculative-disable-by-batch-size`` (vLLM's names)
are declared once here, so several speculative plugins (``qwen35-mtp``, ``prompt-lookup``,
``draft``) can be installed and loaded together without two of them claiming the same
flag; each reads them with ``read_settings(config, SpeculativeSettings)`` and applies
its own default where the user set none. The per-request ``"speculative": false``
option is checked here too.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.errors import OptionError, UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.settings import add_flags, positive_int, read_settings, setting

SPECULATIVE_OPTION = "speculative"
"""Request option: ``{"speculative": false}`` decodes that request plainly."""


@attrs.frozen
class SpeculativeSettings:
    """Shared by the speculative decoders; ``None``: the decoder's own default."""

    num_speculative_tokens: int | None = setting(
        None, flag="--num-speculative-tokens", type=positive_int, metavar="N",
        help="drafts per step of a speculative decoder plugin (default: the plugin's own: "
        "qwen35-mtp 1, prompt-lookup 4, draft 3)",
    )  # fmt: skip
    speculative_disable_by_batch_size: int | None = setting(
        None, flag="--speculative-disable-by-batch-size", type=positive_int, metavar="N",
        help="a speculative decoder decodes plainly while more sequences than this run "
        "(default: the plugin's own: qwen35-mtp 4, prompt-lookup 2, draft 8)",
    )  # fmt: skip

    def tokens(self, default: int) -> int:
        """``num_speculative_tokens``, or ``default`` when unset."""
        return self.num_speculative_tokens or default

    def batch_limit(self, default: int) -> int:
        """``speculative_disable_by_batch_size``, or ``default`` when unset."""
        return self.speculative_disable_by_batch_size or default


def speculative_settings(config: ServerConfig) -> SpeculativeSettings:
    """The shared speculative settings of ``config``."""
    return read_settings(config, SpeculativeSettings)


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
