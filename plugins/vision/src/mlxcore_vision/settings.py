"""The vision plugin's server flags, each declared once with its default."""

from __future__ import annotations

import attrs

from mlxcore.config import ServerConfig
from mlxcore.settings import add_flags, read_settings, setting

DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
"""The largest image accepted by default (16,777,216 pixels)."""


@attrs.frozen
class VisionSettings:
    """What ``--mllm``, the media policy flags, the video sampling flags and
    ``--vision-cache-size`` were set to."""

    mllm: bool = setting(
        False, action="store_true",
        help="vision: load the model with mlx-vlm even if its config does not look multimodal",
    )  # fmt: skip
    allowed_media_domains: tuple[str, ...] | None = setting(
        None, nargs="+", metavar="DOMAIN",
        help="vision: hosts (and subdomains) image URLs may be fetched from (default: none)",
    )  # fmt: skip
    allowed_local_media_path: str | None = setting(
        None, metavar="DIR",
        help="vision: a folder local image paths must be under (default: no local files)",
    )  # fmt: skip
    allow_private_media_urls: bool = setting(
        False, action="store_true",
        help="vision: allow image URLs that resolve to private or loopback addresses",
    )  # fmt: skip
    max_image_pixels: int = setting(
        DEFAULT_MAX_IMAGE_PIXELS, type=int, metavar="N",
        help="vision: the most pixels (width x height) one image may have (default %(default)s)",
    )  # fmt: skip
    video_fps: float | None = setting(
        None, type=float, metavar="FPS",
        help="vision: frames per second sampled from a video (default: mlx-vlm's, 2)",
    )  # fmt: skip
    video_max_frames: int | None = setting(
        None, type=int, metavar="N",
        help="vision: the most frames sampled from one video (default: mlx-vlm's)",
    )  # fmt: skip
    vision_cache_size: int = setting(
        32, type=int, metavar="N",
        help="vision: how many image sets' vision encodings to keep for reuse (0: off)",
    )  # fmt: skip


def add_vision_flags(parser: object) -> None:
    """Add the plugin's flags to its option group."""
    add_flags(parser, VisionSettings)


def vision_settings(config: ServerConfig) -> VisionSettings:
    """The parsed flags (declared defaults for any not given)."""
    return read_settings(config, VisionSettings)
