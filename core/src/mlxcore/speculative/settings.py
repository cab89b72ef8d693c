"""The settings and the request option every speculative decoder shares.

``--num-speculative-tokens`` and ``--speculative-disable-by-batch-size`` (vLLM's names)
are declared once here (the flags come from the built-in plugin
:mod:`mlxcore.builtin.speculative`), so several speculative plugins (``qwen35-mtp``,
``prompt-lookup``, ``draft``) can be installed and loaded together without two of them
claiming the same flag; each reads them with :func:`speculative_settings` and applies its
own default where the user set none.
"""

from __future__ import annotations

import attrs

from mlxcore.config import ServerConfig
from mlxcore.settings import positive_int, read_settings, setting

SPECULATIVE_OPTION = "speculative"
"""Request option: ``{"speculative": false}`` decodes that request plainly."""


@attrs.frozen
class SpeculativeSettings:
    """Shared by the speculative decoders; ``None``: the decoder's own default."""

    num_speculative_tokens: int | None = setting(
        None, type=positive_int, metavar="N",
        help="drafts per step of a speculative decoder plugin (default: the plugin's own: "
        "qwen35-mtp 1, prompt-lookup 4, draft 3)",
    )  # fmt: skip
    speculative_disable_by_batch_size: int | None = setting(
        None, type=positive_int, metavar="N",
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
