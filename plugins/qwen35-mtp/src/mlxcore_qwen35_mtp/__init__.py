"""mlxcore plugin `qwen35-mtp`: Qwen3.5 multi-token-prediction speculative decoding.

Enabled with ``--plugin qwen35-mtp``. At load it attaches the checkpoint's MTP head
(``mtp.*`` tensors, or a ``model-mtp.safetensors`` sidecar) to this model instance, and
offers the :class:`~mlxcore_qwen35_mtp.decoder.MTPDecoder`. ``mlxcore mtp extract``
restores a stripped head. See docs/plugins/qwen35-mtp.md.
"""

from __future__ import annotations

import logging
from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import Decoder
from mlxcore.errors import UsageError
from mlxcore.hookspecs import OptionGroup
from mlxcore.model_info import ModelInfo

MLXCORE_AUTOLOAD = False
"""Not loaded unless named with `--plugin qwen35-mtp` (or its `mtp` command is run)."""

MLXCORE_COMMANDS = ("mtp",)
"""`mlxcore mtp ...` loads this plugin."""

ATTR = "mlxcore_mtp"
"""The attribute of the model instance that holds its bound MTP head."""

log = logging.getLogger(__name__)


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """The decoder options: drafts per step, batch-size limit, the off-switch."""
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=1,
        help="MTP drafts per step (default 1)",
    )
    parser.add_argument(
        "--speculative-disable-by-batch-size",
        type=int,
        default=4,
        help="decode plainly while more sequences than this run (default 4)",
    )
    parser.add_argument(
        "--no-mtp-auto-off",
        dest="mtp_auto_off",
        action="store_false",
        default=True,
        help="keep speculating even when it measures slower than plain decoding",
    )


@hookimpl
def mlxcore_add_commands(subparsers: Any) -> None:
    """``mlxcore mtp extract SOURCE_DIR MODEL_DIR``."""
    from mlxcore_qwen35_mtp.extract import add_commands

    add_commands(subparsers)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the option values."""
    if int(config.option("num_speculative_tokens", 1)) < 1:
        raise UsageError("--num-speculative-tokens must be >= 1")
    if int(config.option("speculative_disable_by_batch_size", 4)) < 1:
        raise UsageError("--speculative-disable-by-batch-size must be >= 1")


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

    return MTPDecoder(
        model,
        head,
        num_speculative_tokens=int(config.option("num_speculative_tokens", 1)),
        disable_by_batch_size=int(config.option("speculative_disable_by_batch_size", 4)),
        auto_off=bool(config.option("mtp_auto_off", True)),
    )


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """``"speculative"`` must be a boolean."""
    value = options.get("speculative")
    if value is not None and not isinstance(value, bool):
        raise ValueError("speculative", "must be true or false")
