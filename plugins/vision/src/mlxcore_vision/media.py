"""Image content parts: fetching under the server's media policy, checking, processing.

Runs on the server's preparation thread. Every problem with a part is a 400 naming it
(``messages[0].content[1]``): undecodable base64, bytes that are not an image, an
unsupported format, too many pixels, a URL or path the policy does not allow.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import mlx.core as mx
import numpy as np

from mlxcore.config import ServerConfig
from mlxcore.errors import MediaError
from mlxcore.media import MediaHandler, MediaPart, PreparedPrompt
from mlxcore_vision.fetch import FetchError, fetch_media
from mlxcore_vision.settings import DEFAULT_MAX_IMAGE_PIXELS, vision_settings
from mlxcore_vision.video import (
    MIXED_MEDIA_MODEL_TYPES,
    NATIVE_VIDEO_MODEL_TYPES,
    VIDEO_PART_TYPES,
    check_video,
    media_url,
    sample_frames,
    server_video_defaults,
    video_sampling,
)

MAX_MEDIA_BYTES = 32 * 1024 * 1024
FETCH_TIMEOUT = 10.0


@attrs.frozen
class MediaPolicy:
    """Where images may come from (vLLM's flag names).

    Attributes:
        allowed_domains: hosts (and their subdomains) http(s) URLs may point at; empty
            means no remote fetching at all.
        allowed_local_path: a folder local paths (``file://`` or plain) must be under;
            ``None`` means no local files.
        allow_private: fetch from private, loopback and link-local addresses too (off
            by default: a server must not become a proxy into its own network).
        max_image_pixels: the most pixels (width x height) one image may have.
    """

    allowed_domains: tuple[str, ...] = ()
    allowed_local_path: Path | None = None
    allow_private: bool = False
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    @classmethod
    def from_config(cls, config: ServerConfig) -> MediaPolicy:
        """The policy from ``--allowed-media-domains``, ``--allowed-local-media-path``,
        ``--allow-private-media-urls`` and ``--max-image-pixels``."""
        settings = vision_settings(config)
        domains = settings.allowed_media_domains or ()
        if isinstance(domains, str):
            domains = tuple(d for d in domains.split(",") if d)
        local = settings.allowed_local_media_path
        return cls(
            allowed_domains=tuple(d.strip().lower().lstrip(".") for d in domains),
            allowed_local_path=Path(local).resolve() if local else None,
            allow_private=bool(settings.allow_private_media_urls),
            max_image_pixels=int(settings.max_image_pixels or DEFAULT_MAX_IMAGE_PIXELS),
        )


@attrs.frozen
class VisionPayload:
    """What a media request carries to the prefill (numpy arrays: made off the engine
    thread, turned into MLX arrays on it).

    Attributes:
        inputs: the processor's outputs (``input_ids``, ``attention_mask``,
            ``pixel_values``, ``image_grid_thw`` ...).
        media_keys: per part, in prompt order, the sha256 of its full bytes (for a video
            with its frame sampling): the key of the vision-encoding cache.
    """

    inputs: dict[str, np.ndarray]
    media_keys: tuple[str, ...]


class VisionMedia(MediaHandler):
    """The media handler of a vision-language model: images (``image_url`` /
    ``input_image`` parts) and videos (``video_url`` / ``video`` parts).

    Args:
        model_type: the checkpoint's ``model_type``.
        processor: mlx-vlm's processor for the checkpoint.
        image_token_index: the config's ``image_token_index`` (passed to mlx-vlm as
            ``mlx_vlm.generate`` does).
        policy: where images may come from and how large they may be.
        video_defaults: the server's video sampling (``--video-fps``,
            ``--video-max-frames``); requests override it.
    """

    part_types: ClassVar[frozenset[str]] = frozenset(
        {"image_url", "input_image", *VIDEO_PART_TYPES}
    )

    def __init__(
        self,
        model_type: str,
        processor: Any,
        image_token_index: Any,
        policy: MediaPolicy,
        video_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.model_type = model_type
        self.processor = processor
        self.image_token_index = image_token_index
        self.policy = policy
        self.video_defaults = dict(video_defaults or {})
        self._media_ids: set[int] = set()

    @classmethod
    def from_config(cls, vlm: Any, processor: Any, config: ServerConfig) -> VisionMedia:
        """The handler for a loaded mlx-vlm model under the server's media policy."""
        handler = cls(
            str(vlm.config.model_type),
            processor,
            getattr(vlm.config, "image_token_index", None),
            MediaPolicy.from_config(config),
            server_video_defaults(config),
        )
        for field in ("image_token_id", "video_token_id", "image_token_index"):
            value = getattr(vlm.config, field, None)
            if isinstance(value, int):
                handler._media_ids.add(value)
        return handler

    @property
    def media_token_ids(self) -> frozenset[int]:
        """The token ids the processor expands media into (image and video pads)."""
        return frozenset(self._media_ids)

    @property
    def native_video(self) -> bool:
        """The family takes clips natively (Qwen-VL); others get frames as images."""
        return self.model_type in NATIVE_VIDEO_MODEL_TYPES

    def placeholder(self, part: Mapping[str, Any]) -> dict[str, Any]:
        is_video = part.get("type") in VIDEO_PART_TYPES
        return {"type": "video" if is_video and self.native_video else "image"}

    def prepare(
        self, prompt_text: str, parts: Sequence[MediaPart], options: Mapping[str, Any]
    ) -> PreparedPrompt:
        from mlx_vlm.utils import prepare_inputs

        videos_in = [p for p in parts if p.part.get("type") in VIDEO_PART_TYPES]
        mixed_refused = self.native_video and self.model_type not in MIXED_MEDIA_MODEL_TYPES
        if mixed_refused and videos_in and len(videos_in) < len(parts):
            raise MediaError(
                "images and videos in one request are not supported yet", videos_in[0].where
            )
        sampling = video_sampling(options, self.video_defaults)
        images: list[Any] = []
        videos: list[str] = []
        keys: list[str] = []
        units: list[str] = []  # one content key per run of media tokens, in order
        frame_counts: list[int] = []  # images each part contributes (frames-as-images)
        with tempfile.TemporaryDirectory(prefix="mlxcore-video-") as scratch:
            for i, media in enumerate(parts):
                if media.part.get("type") not in VIDEO_PART_TYPES:
                    url = media_url(media.part, media.where, "image_url")
                    data = self.fetch(url, media.where, "image_url")
                    keys.append(hashlib.sha256(data).hexdigest())
                    units.append(keys[-1])
                    images.append(self.decode(data, media.where))
                    frame_counts.append(1)
                    continue
                url = media_url(media.part, media.where, "video_url")
                data = self.fetch(url, media.where, "video_url")
                path = Path(scratch) / f"video-{i}"
                path.write_bytes(data)
                check_video(path, media.where)
                keys.append(f"video:{hashlib.sha256(data).hexdigest()}:{sorted(sampling.items())}")
                if self.native_video:
                    videos.append(str(path))
                    units.append(keys[-1])
                else:
                    frames = sample_frames(path, sampling, media.where)
                    images.extend(frames)
                    frame_counts.append(len(frames))
                    units += [f"{keys[-1]}:frame{j}" for j in range(len(frames))]
            if not self.native_video and videos_in:
                prompt_text = self._repeat_markers(prompt_text, frame_counts, parts)
            try:
                inputs = prepare_inputs(
                    self.processor,
                    images=images or None,
                    videos=videos or None,
                    prompts=prompt_text,
                    image_token_index=self.image_token_index,
                    resize_shape=None,
                    # the rendered template already holds the special tokens it wants (a
                    # Gemma template starts with <bos>); adding more gave a second <bos>.
                    # The text route tokenizes the same way (prompts.render_chat).
                    add_special_tokens=False,
                    **(sampling if videos else {}),
                )
            except Exception as exc:  # the processor refuses media it cannot handle
                raise MediaError(
                    f"the model's processor could not process the media: {exc}", parts[0].where
                ) from None
        arrays = {k: np.array(v) for k, v in inputs.items() if isinstance(v, mx.array)}
        arrays = self._template_bos_only(arrays, prompt_text)
        ids = [int(t) for t in arrays["input_ids"][0]]
        key = media_cache_key(ids, self.media_token_ids, units)
        return PreparedPrompt(ids, VisionPayload(arrays, tuple(keys)), cache_key=key)

    def _template_bos_only(
        self, arrays: dict[str, np.ndarray], prompt_text: str
    ) -> dict[str, np.ndarray]:
        """``arrays`` without the BOS a processor added in front of a template that starts
        with its own (Gemma 3's processor tokenizes with special tokens whatever it is
        told): a prompt begins with what the rendered template alone yields."""
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        bos, text = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "bos_token", None)
        ids = arrays["input_ids"]
        if bos is None or not text or ids.ndim != 2 or ids.shape[0] != 1:
            return arrays
        wanted = 1 if prompt_text.startswith(text) else 0
        leading = 0
        while leading < ids.shape[1] and int(ids[0, leading]) == bos:
            leading += 1
        extra = leading - wanted
        if extra <= 0:
            return arrays
        length = ids.shape[1]
        return {
            k: v[:, extra:] if v.ndim == 2 and v.shape == (1, length) else v
            for k, v in arrays.items()
        }

    def _repeat_markers(
        self, prompt_text: str, counts: Sequence[int], parts: Sequence[MediaPart]
    ) -> str:
        """Give each sampled frame its own image marker, in order: the prompt the chat
        template renders for the frames as consecutive image parts."""
        marker = getattr(self.processor, "boi_token", None) or self.processor.image_token
        pieces = prompt_text.split(marker)
        if len(pieces) != len(counts) + 1:
            raise MediaError(
                "the chat template did not render one image marker per media part",
                parts[0].where,
            )
        out = [pieces[0]]
        for count, rest in zip(counts, pieces[1:], strict=True):
            out.append(marker * count + rest)
        return "".join(out)

    # -- fetching and decoding ------------------------------------------------

    def fetch(self, url: str, where: str, field: str = "image_url") -> bytes:
        """The bytes ``url`` names, if the policy allows it (``field``: the part's URL
        field, for error messages)."""
        where = f"{where}.{field}"
        if url.startswith("data:"):
            return _data_uri(url, where)
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme in ("http", "https"):
            return self._fetch_remote(url, where)
        if scheme == "file" or (scheme == "" and url.startswith("/")):
            return self._read_local(url, where)
        raise MediaError(
            f"unsupported media URL scheme {scheme!r}: use a data: URI, or http(s) / local "
            "files where the server allows them",
            where,
        )

    def _fetch_remote(self, url: str, where: str) -> bytes:
        try:
            return fetch_media(
                url,
                allowed_domains=self.policy.allowed_domains,
                allow_private=self.policy.allow_private,
                timeout=FETCH_TIMEOUT,
                max_bytes=MAX_MEDIA_BYTES,
            )
        except FetchError as exc:
            raise MediaError(str(exc), where) from None

    def _read_local(self, url: str, where: str) -> bytes:
        root = self.policy.allowed_local_path
        raw = urllib.parse.unquote(urllib.parse.urlsplit(url).path) if "://" in url else url
        if root is None:
            raise MediaError(
                "local image paths are not allowed (--allowed-local-media-path)",
                where,
            )
        path = Path(raw).resolve()
        if not path.is_relative_to(root):
            raise MediaError("the media path is outside --allowed-local-media-path", where)
        try:
            if path.stat().st_size > MAX_MEDIA_BYTES:
                raise MediaError("the media file is larger than 32 MiB", where)
            return path.read_bytes()
        except OSError as exc:
            raise MediaError(f"cannot read the media file: {exc.strerror}", where) from None

    def decode(self, data: bytes, where: str) -> Any:
        """``data`` as an RGB PIL image, after the pixel-count check."""
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(data))
        except UnidentifiedImageError:
            raise MediaError("the data is not an image in a supported format", where) from None
        except Exception as exc:
            raise MediaError(f"the image cannot be read: {exc}", where) from None
        width, height = image.size
        if width * height > self.policy.max_image_pixels:
            raise MediaError(
                f"the image has {width}x{height} pixels, more than the "
                f"{self.policy.max_image_pixels} allowed (--max-image-pixels)",
                where,
            )
        try:
            return image.convert("RGB")
        except Exception as exc:
            raise MediaError(f"the image cannot be decoded: {exc}", where) from None


def _data_uri(url: str, where: str) -> bytes:
    header, sep, body = url.partition(",")
    if not sep:
        raise MediaError("a data: URI needs a comma before its data", where)
    if not header.endswith(";base64"):
        raise MediaError("only base64 data: URIs are supported", where)
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the data: URI is not valid base64", where) from None
    if not data:
        raise MediaError("the data: URI is empty", where)
    return data


def media_cache_key(
    ids: Sequence[int], media_ids: frozenset[int], units: Sequence[str]
) -> list[int]:
    """``ids`` with each run of media tokens replaced by a negative id derived from the
    content of the medium it stands for (``units``, one per run, in order), so the prefix
    cache reuses a prefix only when the same media sit at the same places. When the runs
    cannot be matched to the media one to one, every run gets a key of all the media."""
    runs: list[tuple[int, int]] = []
    for i, token in enumerate(ids):
        if token in media_ids:
            if runs and runs[-1][1] == i:
                runs[-1] = (runs[-1][0], i + 1)
            else:
                runs.append((i, i + 1))
    labels = list(units) if len(units) == len(runs) else ["|".join(units)] * len(runs)
    key = list(ids)
    for n, ((start, end), label) in enumerate(zip(runs, labels, strict=True)):
        digest = hashlib.sha256(f"{n}:{label}".encode()).hexdigest()
        key[start:end] = [-(1 + int(digest[:15], 16))] * (end - start)
    return key
