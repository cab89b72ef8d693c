"""mlxcore plugin `prompt-lookup`: speculative decoding with drafts copied from the prompt.

Enabled with ``--plugin prompt-lookup``; offers the
:class:`~mlxcore_prompt_lookup.decoder.PromptLookupDecoder` for every model whose cache can
roll back per row (attention-only models, Qwen3.5 hybrids). Shared flags:
``--num-speculative-tokens`` (default 4 here), ``--speculative-disable-by-batch-size``
(default 2 here); its own: ``--lookup-ngram`` and ``--lookup-min-ngram``. A request with
``"speculative": false`` decodes plainly. See docs/plugins/prompt-lookup.md.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import Decoder
from mlxcore.errors import UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo
from mlxcore.settings import add_flags, positive_int, read_settings, setting
from mlxcore.speculative.settings import speculative_settings

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin prompt-lookup`."""

DEFAULT_TOKENS = 4
"""Drafts per round unless ``--num-speculative-tokens`` says otherwise."""

DEFAULT_BATCH_LIMIT = 2
"""``--speculative-disable-by-batch-size`` unless set: measured on a 2-core CPU, a round
that verifies extra positions for three or more sequences costs more than the copied
tokens save (docs/plugins/prompt-lookup.md); a faster machine may raise it."""


@attrs.frozen
class PromptLookupSettings:
    """The lookup's own settings; each default is stated here only."""

    lookup_ngram: int = setting(
        3, type=positive_int, metavar="N",
        help="longest ending of the text so far searched for in it (default %(default)s)",
    )  # fmt: skip
    lookup_min_ngram: int = setting(
        2, type=positive_int, metavar="N",
        help="shortest ending that may propose drafts (default %(default)s)",
    )  # fmt: skip
    lookup_auto_off: bool = setting(
        True, action="store_false",
        help="keep speculating even when it measures slower than plain decoding",
    )  # fmt: skip


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """The lookup's options."""
    add_flags(parser, PromptLookupSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the n-gram bounds (also when set without the command line)."""
    settings = read_settings(config, PromptLookupSettings)
    for name in ("lookup_ngram", "lookup_min_ngram"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
    if settings.lookup_min_ngram > settings.lookup_ngram:
        raise UsageError(
            f"--lookup-min-ngram ({settings.lookup_min_ngram}) is larger than --lookup-ngram "
            f"({settings.lookup_ngram})"
        )


@hookimpl
def mlxcore_decoder(model: Any, info: ModelInfo, config: ServerConfig) -> Decoder | None:
    """The prompt-lookup decoder."""
    from mlxcore_prompt_lookup.decoder import PromptLookupDecoder

    settings = read_settings(config, PromptLookupSettings)
    shared = speculative_settings(config)
    return PromptLookupDecoder(
        model,
        num_speculative_tokens=shared.tokens(DEFAULT_TOKENS),
        max_ngram=settings.lookup_ngram,
        min_ngram=settings.lookup_min_ngram,
        disable_by_batch_size=shared.batch_limit(DEFAULT_BATCH_LIMIT),
        auto_off=settings.lookup_auto_off,
    )
