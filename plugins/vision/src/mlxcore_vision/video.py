"""Video content parts: where their URL is, how frames are sampled, and a readability check.

Qwen-VL models take a clip natively (temporal patches, M-RoPE over time): mlx-vlm's
processor samples the frames (``fps``, ``max_frames``) and expands the video placeholder.
Other families get the sampled frames as consecutive images, in order.
Sampling comes from the server flags ``--video-fps`` / ``--video-max-frames`` and may be
overridden per request with the body fields ``video_fps`` / ``video_max_frames``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxcore.config import ServerConfig
from mlxcore.errors import MediaError, OptionError
from mlxcore_vision.settings import vision_settings

VIDEO_PART_TYPES = frozenset({"video_url", "video"})
"""Content part types carrying a clip: ``{"type": "video_url", "video_url": {"url": ...}}``."""

NATIVE_VIDEO_MODEL_TYPES = frozenset(
    {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe"}
)
"""Families whose mlx-vlm processor takes a clip (temporal patches, M-RoPE over time)."""

MIXED_MEDIA_MODEL_TYPES = frozenset({"qwen3_vl"})
"""Native-video families whose mlx-vlm model embeds images and videos in one call (the
others embed one kind per request, so images with videos are refused for them)."""

DEFAULT_FRAMES_AS_IMAGES = 8
"""The most frames a clip becomes for families without native video (each frame is a
whole image's worth of tokens), unless ``video_max_frames`` says otherwise."""

OPTION_FPS = "video_fps"
OPTION_MAX_FRAMES = "video_max_frames"
MAX_FRAMES_LIMIT = 768


def media_url(part: Mapping[str, Any], where: str, field: str) -> str:
    """The URL of an image or video part (``{field: {"url": ...}}`` or ``{field: "..."}``;
    ``input_image`` / ``video`` parts may name it ``image`` / ``video``)."""
    value = part.get(field, part.get(field.removesuffix("_url")))
    if isinstance(value, Mapping):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise MediaError(
            f"a {field.removesuffix('_url')} part needs {field}.url", f"{where}.{field}"
        )
    return value


def check_options(options: Mapping[str, Any]) -> None:
    """Validate the per-request video fields; ``OptionError(field, message)`` on a bad one."""
    fps = options.get(OPTION_FPS)
    if fps is not None and (
        isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps <= 60
    ):
        raise OptionError(OPTION_FPS, "must be a number in (0, 60]")
    frames = options.get(OPTION_MAX_FRAMES)
    if frames is not None and (
        isinstance(frames, bool)
        or not isinstance(frames, int)
        or not 2 <= frames <= MAX_FRAMES_LIMIT
    ):
        raise OptionError(OPTION_MAX_FRAMES, f"must be an integer from 2 to {MAX_FRAMES_LIMIT}")


def server_video_defaults(config: ServerConfig) -> dict[str, Any]:
    """The server's sampling (``--video-fps``, ``--video-max-frames``) as mlx-vlm fields."""
    settings = vision_settings(config)
    out: dict[str, Any] = {}
    if settings.video_fps is not None:
        out["fps"] = float(settings.video_fps)
    if settings.video_max_frames is not None:
        out["max_frames"] = int(settings.video_max_frames)
    return out


def video_sampling(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """mlx-vlm's sampling fields for one request: its options over the server defaults."""
    out = dict(defaults)
    if options.get(OPTION_FPS) is not None:
        out["fps"] = float(options[OPTION_FPS])
    if options.get(OPTION_MAX_FRAMES) is not None:
        out["max_frames"] = int(options[OPTION_MAX_FRAMES])
    return out


def check_video(path: Path, where: str) -> int:
    """The clip's frame count; a 400 naming the part when it is no readable video or has
    no frames."""
    import cv2

    cap = cv2.VideoCapture(str(path))
    try:
        if not cap.isOpened():
            raise MediaError("the data is not a video in a supported format", where)
        frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        ok, _ = cap.read()
    finally:
        cap.release()
    if frames <= 0 or not ok:
        raise MediaError("the video has no frames", where)
    if frames < 2:
        raise MediaError("the video needs at least 2 frames", where)
    return frames


def sample_frames(path: Path, sampling: Mapping[str, Any], where: str) -> list[Any]:
    """The clip's frames as RGB PIL images, sampled as mlx-vlm samples clips (its
    ``load_video`` with ``fps`` / ``max_frames``; at most
    :data:`DEFAULT_FRAMES_AS_IMAGES` unless ``max_frames`` is set)."""
    from mlx_vlm.utils import load_video
    from PIL import Image

    fields = {"max_frames": DEFAULT_FRAMES_AS_IMAGES, **sampling}
    try:
        frames, _ = load_video(str(path), **fields)
    except Exception as exc:
        raise MediaError(f"the video's frames cannot be read: {exc}", where) from None
    if len(frames) == 0:
        raise MediaError("the video has no frames", where)
    return [Image.fromarray(frame.transpose(1, 2, 0)) for frame in frames]
