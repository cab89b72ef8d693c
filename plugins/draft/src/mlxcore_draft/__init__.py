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
from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.builtin.speculative import speculative_settings
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import Decoder
from mlxcore.errors import UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo
from mlxcore.settings import add_flags, read_settings, setting

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
        None, flag="--draft-model", metavar="PATH_OR_REPO",
        help="the draft model: a small model with the target's tokenizer (local folder or "
        "Hugging Face repo id)",
    )  # fmt: skip
    draft_auto_off: bool = setting(
        True, flag="--no-draft-auto-off", action="store_false",
        help="keep speculating even when it measures slower than plain decoding",
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


def tokenizer_difference(target: dict[str, int], draft: dict[str, int]) -> str | None:
    """Why two vocabularies (token text -> id, special tokens included) differ, or None."""
    if target == draft:
        return None
    for text, tid in sorted(target.items(), key=lambda item: item[1]):
        if draft.get(text) != tid:
            other = draft.get(text)
            where = "has no such token" if other is None else f"has it as id {other}"
            return f"the target's token {text!r} (id {tid}): the draft {where}"
    extra = sorted(set(draft) - set(target), key=lambda t: draft[t])
    return f"the draft has tokens the target lacks, e.g. {extra[0]!r} (id {draft[extra[0]]})"


@hookimpl
def mlxcore_decoder(model: Any, info: ModelInfo, config: ServerConfig) -> Decoder | None:
    """The draft decoder, after checking the draft against the target."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxcore.models.loader import load_model
    from mlxcore.speculative.verify import TargetVerifier
    from mlxcore_draft.decoder import DraftDecoder

    settings = read_settings(config, DraftSettings)
    source = settings.draft_model
    assert source is not None  # mlxcore_configure checked it
    if not TargetVerifier(model).supports(make_prompt_cache(model)):
        raise UsageError(
            f"plugin 'draft': the target {info.path} ({info.model_type}) has a cache that "
            "cannot roll back rejected drafts (sliding-window or other non-attention "
            "layers); serve it without --plugin draft"
        )
    loaded = load_model(source)
    if info.vocab:
        why = tokenizer_difference(info.vocab, loaded.info.vocab)
        if why is not None:
            raise UsageError(
                f"--draft-model {source}: its tokenizer differs from the target's "
                f"({len(loaded.info.vocab)} vs {len(info.vocab)} tokens; {why})"
            )
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
    shared = speculative_settings(config)
    log.info("draft: target %s, draft %s", info.path, loaded.info.path)
    return DraftDecoder(
        model,
        draft,
        num_speculative_tokens=shared.tokens(DEFAULT_TOKENS),
        disable_by_batch_size=shared.batch_limit(DEFAULT_BATCH_LIMIT),
        auto_off=settings.draft_auto_off,
        prefill_step=config.prefill_step_size,
    )
