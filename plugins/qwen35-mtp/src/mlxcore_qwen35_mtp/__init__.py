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
from mlxcore.errors import OptionError, UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo
from mlxcore.settings import add_flags, positive_int, read_settings, setting

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin qwen35-mtp` (or its `mtp` command is run)."""

MLXCORE_COMMANDS = ("mtp",)
"""`mlxcore mtp ...` loads this plugin."""

ATTR = "mlxcore_mtp"
"""The attribute of the model instance that holds its bound MTP head."""

log = logging.getLogger(__name__)


@attrs.frozen
class MTPSettings:
    """The decoder's settings; each default is stated here only."""

    num_speculative_tokens: int = setting(
        1, flag="--num-speculative-tokens", type=positive_int, metavar="N",
        help="MTP drafts per step (default %(default)s)",
    )  # fmt: skip
    speculative_disable_by_batch_size: int = setting(
        4, flag="--speculative-disable-by-batch-size", type=positive_int, metavar="N",
        help="decode plainly while more sequences than this run (default %(default)s)",
    )  # fmt: skip
    mtp_auto_off: bool = setting(
        True, flag="--no-mtp-auto-off", action="store_false",
        help="keep speculating even when it measures slower than plain decoding",
    )  # fmt: skip


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """The decoder options: drafts per step, batch-size limit, the off-switch."""
    add_flags(parser, MTPSettings)


@hookimpl
def mlxcore_add_commands(subparsers: Any) -> None:
    """``mlxcore mtp extract SOURCE_DIR MODEL_DIR``."""
    from mlxcore_qwen35_mtp.extract import add_commands

    add_commands(subparsers)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the option values (also when set without the command line)."""
    settings = read_settings(config, MTPSettings)
    for field in ("num_speculative_tokens", "speculative_disable_by_batch_size"):
        value = getattr(settings, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"--{field.replace('_', '-')} must be an integer >= 1, got {value!r}")


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
    return MTPDecoder(
        model,
        head,
        num_speculative_tokens=settings.num_speculative_tokens,
        disable_by_batch_size=settings.speculative_disable_by_batch_size,
        auto_off=settings.mtp_auto_off,
    )


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """``"speculative"`` must be a boolean."""
    value = options.get("speculative")
    if value is not None and not isinstance(value, bool):
        raise OptionError("speculative", "must be true or false")
