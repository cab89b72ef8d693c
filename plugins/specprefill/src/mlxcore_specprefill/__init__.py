"""mlxcore plugin `specprefill`: SpecPrefill attention-scored sparse prefill.

``mlxcore serve TARGET --plugin specprefill --specprefill-draft-model DRAFT``: for
prompts of at least ``--specprefill-threshold`` uncached tokens, a small draft model
with the same tokenizer scores how much each prompt token matters and the target is
prefilled with only the best chunks (``--specprefill-keep``) at their original
positions. Supported targets (recognised by structure): Llama/Qwen3-style attention
(GQA, q/k norms, rope scaling), Qwen3.5-style hybrids (GatedDeltaNet + gated
attention), GPT-OSS-style alternating sliding-window layers with attention sinks,
and position-free Nemotron-H-style stacks (Mamba-2, attention without RoPE, MLP/MoE
blocks; target only). Other targets (Gemma, ...) get normal chunked prefill, with the
reason logged. See docs/plugins/specprefill.md.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import PrefillStrategy
from mlxcore.errors import OptionError, UsageError
from mlxcore.model_info import ModelInfo
from mlxcore.resources import ModelResources
from mlxcore_specprefill.options import FLAGS, add_options, request_settings, server_settings
from mlxcore_specprefill.sequential import detect_target, probe_target
from mlxcore_specprefill.stack import Unsupported, detect, probe
from mlxcore_specprefill.strategy import SpecPrefill

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin specprefill`."""

log = logging.getLogger("mlxcore.plugins.specprefill")
"""Under ``mlxcore`` so the CLI's log handler shows it."""


@hookimpl
def mlxcore_addoption(parser: Any) -> None:
    """``--specprefill-draft-model``, ``--specprefill-[no-]enabled``, ``-threshold``,
    ``-keep``, ``-chunk``."""
    add_options(parser)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the flags: valid values, and a draft model when enabled."""
    try:
        settings = server_settings(config)
    except OptionError as exc:
        field, message = exc.field, exc.message
        flag = FLAGS.get(str(field).rsplit(".", 1)[-1], str(field))
        raise UsageError(f"{flag}: {message}") from exc
    if settings.enabled and not settings.draft_model:
        raise UsageError(
            "plugin 'specprefill' needs --specprefill-draft-model PATH (a small model with "
            "the target's tokenizer), or --no-specprefill-enabled"
        )


@attrs.frozen
class ScoringDraft:
    """The scoring draft and the target's structure, found and checked once per target
    load (the plugin's resource)."""

    target: Any
    draft: Any


@hookimpl
def mlxcore_model_resources(
    model: Any, info: ModelInfo, config: ServerConfig
) -> ScoringDraft | None:
    """Load the scoring draft once, for a supported target; ``None`` (normal prefill) for
    an unsupported one, with the reason logged."""
    from mlxcore.models.drafts import load_draft

    draft_path = config.option("specprefill_draft_model")
    if not draft_path:
        log.warning("specprefill: no --specprefill-draft-model; using normal prefill")
        return None
    try:
        target = detect_target(model)
        probe_target(target)
    except Unsupported as exc:
        log.warning(
            "specprefill: target %s (%s) is not supported, using normal prefill: %s",
            info.path,
            info.model_type,
            exc,
        )
        return None
    loaded = load_draft(str(draft_path), info, "--specprefill-draft-model")
    try:
        draft = detect(loaded.model)
        probe(draft)
    except Unsupported as exc:
        raise UsageError(
            f"--specprefill-draft-model {draft_path} ({loaded.info.model_type}) cannot be "
            f"used as a draft: {exc}"
        ) from exc
    log.info("specprefill: target %s, draft %s", info.path, loaded.info.path)
    return ScoringDraft(target, draft)


@hookimpl
def mlxcore_prefill_strategy(
    model: Any, info: ModelInfo, config: ServerConfig, resources: ModelResources
) -> PrefillStrategy | None:
    """SpecPrefill around the draft loaded at start-up; ``None`` (chunked prefill) when
    there is none (an unsupported target)."""
    scoring = resources.get(ScoringDraft)
    if scoring is None:
        return None
    return SpecPrefill(
        scoring.target, scoring.draft, server_settings(config), config.prefill_step_size
    )


@hookimpl
def mlxcore_request_options() -> list[str]:
    """``specprefill``: per-request settings (``enabled``, ``keep`` ...)."""
    return ["specprefill"]


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """Check the request's ``"specprefill"`` field (400 naming the bad sub-field)."""
    settings = request_settings(server_settings(config), options)
    if settings.enabled and not config.option("specprefill_draft_model"):
        raise OptionError("specprefill.enabled", "this server has no SpecPrefill draft model")
