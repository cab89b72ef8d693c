"""mlxcore plugin `vision`: vision-language models on mlx-vlm's public API.

A checkpoint with a ``vision_config`` and vision weights (or any checkpoint with
``--mllm``) is loaded with ``mlx_vlm.load``. Chat requests may then carry OpenAI
``image_url`` content parts (data: URIs; http(s) only for ``--allowed-media-domains``;
local files only under ``--allowed-local-media-path``). Requests with images prefill
through the vision model and then decode in the engine's shared batch; requests without
media run on the language model alone, with prefix reuse. See docs/plugins/vision.md.

Importing this module is cheap: mlx-vlm is imported only when a vision checkpoint loads.
"""

from __future__ import annotations

import logging
from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.engine.strategies import PrefillStrategy
from mlxcore.errors import OptionError, UsageError
from mlxcore.model_info import ModelInfo

MLXCORE_AUTOLOAD = True
"""Loaded automatically: it only acts on vision-language checkpoints."""

log = logging.getLogger("mlxcore.plugins.vision")


@hookimpl
def mlxcore_addoption(parser: Any) -> None:
    """``--mllm``, ``--allowed-media-domains``, ``--allowed-local-media-path``,
    ``--allow-private-media-urls``, ``--max-image-pixels``, ``--video-fps``,
    ``--video-max-frames``, ``--vision-cache-size``."""
    from mlxcore_vision.settings import add_vision_flags

    add_vision_flags(parser)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the vision flags."""
    from mlxcore_vision.settings import vision_settings
    from mlxcore_vision.video import check_options

    settings = vision_settings(config)
    if settings.max_image_pixels < 1:
        raise UsageError("--max-image-pixels must be at least 1")
    if settings.vision_cache_size < 0:
        raise UsageError("--vision-cache-size must be 0 or more")
    try:
        check_options(
            {"video_fps": settings.video_fps, "video_max_frames": settings.video_max_frames}
        )
    except OptionError as exc:
        field, message = exc.field, exc.message
        raise UsageError(f"--{field.replace('_', '-')} {message}") from None


@hookimpl
def mlxcore_request_options() -> list[str]:
    """``video_fps``, ``video_max_frames``."""
    return ["video_fps", "video_max_frames"]


@hookimpl
def mlxcore_validate_options(options: dict[str, Any], config: ServerConfig) -> None:
    """Per-request ``video_fps`` / ``video_max_frames``."""
    from mlxcore_vision.video import check_options

    check_options(options)


@hookimpl
def mlxcore_load_model(model: Any, config: ServerConfig) -> Any:
    """Load vision-language checkpoints with mlx-vlm; pass on text checkpoints."""
    from mlxcore_vision.loader import load_vision_model

    return load_vision_model(model, config)


@hookimpl
def mlxcore_prefill_strategy(
    model: Any, info: ModelInfo, config: ServerConfig
) -> PrefillStrategy | None:
    """Route requests on a vision-language model: media through the vision model,
    text through the language model."""
    from mlxcore_vision.loader import vlm_of

    vlm = vlm_of(model)
    if vlm is None:
        return None
    from mlxcore_vision.prefill import VisionPrefill
    from mlxcore_vision.settings import vision_settings

    return VisionPrefill(
        model,
        vlm,
        step_size=config.prefill_step_size,
        encoding_cache_size=vision_settings(config).vision_cache_size,
    )
