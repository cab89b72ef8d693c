"""mlxcore plugin `draft`: speculative decoding with a small draft model.

Enabled with ``--plugin draft --draft-model PATH_OR_REPO``; the draft must use the
target's tokenizer (same vocabulary, special tokens included), or the server refuses to
start. Offers the :class:`~mlxcore_draft.decoder.DraftDecoder` for every target whose
cache can roll back per row (attention-only models, Qwen3.5 hybrids). Shared flags:
``--num-speculative-tokens`` (default 3 here), ``--speculative-disable-by-batch-size``
(default 8 here); its own: ``--draft-model`` and ``--no-draft-auto-off``. A request with
``"speculative": false`` decodes plainly. See docs/plugins/draft.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import Decoder
from mlxcore.errors import UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo
from mlxcore.resources import ModelResources
from mlxcore.settings import add_flags, byte_size, read_settings, setting
from mlxcore.speculative.settings import speculative_settings

if TYPE_CHECKING:
    from mlxcore_draft.prefixes import DraftPrefixes

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin draft`."""

DEFAULT_TOKENS = 3
"""Drafts per round unless ``--num-speculative-tokens`` says otherwise."""

DEFAULT_BATCH_LIMIT = 8
"""``--speculative-disable-by-batch-size`` unless set."""

log = logging.getLogger("mlxcore.plugins.draft")
"""Under ``mlxcore`` so the CLI's log handler shows it."""


@attrs.frozen
class DraftSettings:
    """The draft plugin's own settings; each default is stated here only."""

    draft_model: str | None = setting(
        None, metavar="PATH_OR_REPO",
        help="the draft model: a small model with the target's tokenizer (local folder or "
        "Hugging Face repo id)",
    )  # fmt: skip
    draft_auto_off: bool = setting(
        True, action="store_false",
        help="keep speculating even when it measures slower than plain decoding",
    )  # fmt: skip
    draft_prefix_cache_size: int = setting(
        256 * 2**20, type=byte_size, metavar="SIZE",
        help="the draft's own prefix store (e.g. 256MiB, 0 turns it off): finished sequences' "
        "draft caches, reused when a new sequence starts with the same tokens; counted in the "
        "memory budget and given back before a request is refused",
    )  # fmt: skip


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--draft-model`` and ``--no-draft-auto-off``."""
    add_flags(parser, DraftSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """A draft model is required."""
    settings = read_settings(config, DraftSettings)
    if not settings.draft_model or not isinstance(settings.draft_model, str):
        raise UsageError(
            "plugin 'draft' needs --draft-model PATH_OR_REPO (a small model with the "
            "target's tokenizer)"
        )
    size = settings.draft_prefix_cache_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise UsageError(f"--draft-prefix-cache-size must be a size ≥ 0 (got {size!r})")


@attrs.frozen
class DraftModel:
    """The draft model, loaded and checked once per target load (the plugin's resource)."""

    model: Any
    path: str
    prefixes: DraftPrefixes | None = None
    """The draft's prefix store, kept across decoder restarts (None: turned off)."""


@hookimpl
def mlxcore_model_resources(model: Any, info: ModelInfo, config: ServerConfig) -> DraftModel:
    """Load the draft once, after checking the target and the draft can speculate together."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcore.models.drafts import load_draft
    from mlxcore.speculative.verify import TargetVerifier
    from mlxcore_draft.prefixes import DraftPrefixes

    source = read_settings(config, DraftSettings).draft_model
    assert source is not None  # mlxcore_configure checked it
    if not TargetVerifier(model).supports(make_prompt_cache(model)):
        raise UsageError(
            f"plugin 'draft': the target {info.path} ({info.model_type}) has a cache that "
            "cannot roll back rejected drafts (sliding-window or other non-attention "
            "layers); serve it without --plugin draft"
        )
    loaded = load_draft(source, info, "--draft-model")
    draft = loaded.model
    if not TargetVerifier(draft).supports(make_prompt_cache(draft)):
        raise UsageError(
            f"--draft-model {source} ({loaded.info.model_type}): its cache cannot roll back "
            "rejected drafts (sliding-window or other non-attention layers); pick an "
            "attention-only or Qwen3.5-style draft"
        )
    try:  # one token through the draft: a checkpoint that loads but cannot run stops here
        mx.eval(draft(mx.array([[0]]), cache=make_prompt_cache(draft)))
    except Exception as exc:  # mlx-lm raises anything from a broken model
        raise UsageError(
            f"--draft-model {source} ({loaded.info.model_type}): the draft cannot run "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    log.info("draft: target %s, draft %s", info.path, loaded.info.path)
    size = read_settings(config, DraftSettings).draft_prefix_cache_size
    prefixes = DraftPrefixes(size) if size > 0 else None
    return DraftModel(draft, str(loaded.info.path), prefixes)


@hookimpl
def mlxcore_decoder(
    model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
) -> Decoder | None:
    """The draft decoder around the draft loaded at start-up (built again after a restart
    or a failed step, never reloading the draft)."""
    from mlxcore_draft.decoder import DraftDecoder

    draft = resources.get(DraftModel)
    if draft is None:
        return None
    shared = speculative_settings(config)
    return DraftDecoder(
        model,
        draft.model,
        num_speculative_tokens=shared.tokens(DEFAULT_TOKENS),
        disable_by_batch_size=shared.batch_limit(DEFAULT_BATCH_LIMIT),
        auto_off=read_settings(config, DraftSettings).draft_auto_off,
        prefill_step=config.prefill_step_size,
        prefixes=draft.prefixes,
    )
