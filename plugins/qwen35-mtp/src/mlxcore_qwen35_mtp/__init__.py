"""mlxcore plugin `qwen35-mtp`: Qwen3.5 multi-token-prediction speculative decoding.

Enabled with ``--plugin qwen35-mtp``. At load it attaches the checkpoint's MTP head
(``mtp.*`` tensors, or a ``model-mtp.safetensors`` sidecar) to this model instance, and
offers the :class:`~mlxcore_qwen35_mtp.decoder.MTPDecoder`. ``mlxcore mtp extract``
restores a stripped head. See docs/plugins/qwen35-mtp.md.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import Decoder
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo
from mlxcore.settings import add_flags, read_settings, setting
from mlxcore.speculative.settings import speculative_settings

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin qwen35-mtp` (or its `mtp` command is run)."""

MLXCORE_COMMANDS = ("mtp",)
"""`mlxcore mtp ...` loads this plugin."""

ATTR = "mlxcore_mtp"
"""The attribute of the model instance that holds its bound MTP head."""

log = logging.getLogger(__name__)


@attrs.frozen
class MTPSettings:
    """The decoder's own settings; ``--num-speculative-tokens`` (default 1 here) and
    ``--speculative-disable-by-batch-size`` (default 4 here) are the core's shared ones
    (:mod:`mlxcore.builtin.speculative`)."""

    mtp_auto_off: bool = setting(
        True, action="store_false",
        help="keep speculating even when it measures slower than plain decoding",
    )  # fmt: skip


DEFAULT_TOKENS = 1
"""Drafts per round unless ``--num-speculative-tokens`` says otherwise."""

DEFAULT_BATCH_LIMIT = 4
"""``--speculative-disable-by-batch-size`` unless set."""


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """The decoder's own option: the off-switch."""
    add_flags(parser, MTPSettings)


@hookimpl
def mlxcore_add_commands(subparsers: Any) -> None:
    """``mlxcore mtp extract SOURCE_DIR MODEL_DIR``."""
    from mlxcore_qwen35_mtp.extract import add_commands

    add_commands(subparsers)


@hookimpl
def mlxcore_patch_model(model: Any, info: ModelInfo, config: ServerConfig) -> None:
    """Attach the MTP head to this model instance when the checkpoint carries one."""
    from mlxcore_qwen35_mtp.head import SUPPORTED_TYPES, build_head, has_mtp_weights

    if info.model_type not in SUPPORTED_TYPES:
        log.warning("qwen35-mtp: model type %r has no Qwen3.5 MTP head; off", info.model_type)
        return
    if not has_mtp_weights(info):
        log.warning(
            "qwen35-mtp: %s has no mtp.* weights (restore them with `mlxcore mtp extract`); off",
            info.path,
        )
        return
    setattr(model, ATTR, build_head(model, info))


@hookimpl
def mlxcore_decoder(model: Any, info: ModelInfo, config: ServerConfig) -> Decoder | None:
    """The MTP speculative decoder, for a model whose head is attached."""
    head = getattr(model, ATTR, None)
    if head is None:
        return None
    from mlxcore_qwen35_mtp.decoder import MTPDecoder

    settings = read_settings(config, MTPSettings)
    shared = speculative_settings(config)
    return MTPDecoder(
        model,
        head,
        num_speculative_tokens=shared.tokens(DEFAULT_TOKENS),
        disable_by_batch_size=shared.batch_limit(DEFAULT_BATCH_LIMIT),
        auto_off=settings.mtp_auto_off,
    )
