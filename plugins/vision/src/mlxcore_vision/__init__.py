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
from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo

MLXCORE_AUTOLOAD = True
"""Loaded automatically: it only acts on vision-language checkpoints."""

log = logging.getLogger("mlxcore.plugins.vision")


@hookimpl
def mlxcore_addoption(parser: Any) -> None:
    """``--mllm``, ``--allowed-media-domains``, ``--allowed-local-media-path``,
    ``--allow-private-media-urls``, ``--max-image-pixels``, ``--video-fps``,
    ``--video-max-frames``, ``--vision-cache-size``."""
    parser.add_argument(
        "--mllm",
        action="store_true",
        default=False,
        help="vision: load the model with mlx-vlm even if its config does not look multimodal",
    )
    parser.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=None,
        metavar="DOMAIN",
        help="vision: hosts (and subdomains) image URLs may be fetched from (default: none)",
    )
    parser.add_argument(
        "--allowed-local-media-path",
        default=None,
        metavar="DIR",
        help="vision: a folder local image paths must be under (default: no local files)",
    )
    parser.add_argument(
        "--allow-private-media-urls",
        action="store_true",
        default=False,
        help="vision: allow image URLs that resolve to private or loopback addresses",
    )
    parser.add_argument(
        "--max-image-pixels",
        type=int,
        default=None,
        metavar="N",
        help="vision: the most pixels (width x height) one image may have (default 16777216)",
    )
    parser.add_argument(
        "--video-fps",
        type=float,
        default=None,
        metavar="FPS",
        help="vision: frames per second sampled from a video (default: mlx-vlm's, 2)",
    )
    parser.add_argument(
        "--video-max-frames",
        type=int,
        default=None,
        metavar="N",
        help="vision: the most frames sampled from one video (default: mlx-vlm's)",
    )
    parser.add_argument(
        "--vision-cache-size",
        type=int,
        default=32,
        metavar="N",
        help="vision: how many image sets' vision encodings to keep for reuse (0: off)",
    )


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Check the vision flags."""
    pixels = config.option("max_image_pixels")
    if pixels is not None and pixels < 1:
        raise UsageError("--max-image-pixels must be at least 1")
    size = config.option("vision_cache_size", 32)
    if size is not None and size < 0:
        raise UsageError("--vision-cache-size must be 0 or more")
    from mlxcore_vision.video import check_options

    try:
        check_options(
            {
                "video_fps": config.option("video_fps"),
                "video_max_frames": config.option("video_max_frames"),
            }
        )
    except ValueError as exc:
        field, message = exc.args
        raise UsageError(f"--{field.replace('_', '-')} {message}") from None


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

    return VisionPrefill(
        model,
        vlm,
        step_size=config.prefill_step_size,
        encoding_cache_size=int(config.option("vision_cache_size", 32) or 0),
    )
