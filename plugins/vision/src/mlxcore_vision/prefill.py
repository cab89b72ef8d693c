"""Prefill for a vision-language model: media requests through the vision model, text
requests through the text view (chunked, with prefix reuse).

A media request's prefill follows ``mlx_vlm.generate`` step for step (same embedding
call, same chunking, same explicit M-RoPE positions), so its greedy output is
token-identical to mlx-vlm's. It then returns the M-RoPE shift of the prompt as
``position_offset``: the decoder places the sequence's next tokens at
``cache length + shift`` and it decodes in the shared batch like any text sequence.

The vision encoder runs here (not inside mlx-vlm) so that its output can be cached by
the media's hashes and a repeat skip it. For Qwen3-VL the cached output includes the
deepstack features, which mlx-vlm's cached-features path would drop: the prefill hands
them to the language model itself, in the order of the prompt's visual tokens.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import trim_prompt_cache

from mlxcore.defaults.chunked_prefill import ChunkedPrefill
from mlxcore.engine.strategies import PrefillGenerator, PrefillResult, PrefillStrategy, PrefillTask
from mlxcore_vision.media import VisionPayload

log = logging.getLogger("mlxcore.plugins.vision")

_NOT_SEQUENCE_INPUTS = ("input_ids", "pixel_values", "attention_mask")

DEEPSTACK_MODEL_TYPES = frozenset({"qwen3_vl"})
"""Families whose vision tower also returns deepstack features, which the language model
adds to the hidden states of its first layers at the visual token positions."""

Features = tuple[mx.array, tuple[mx.array, ...]]
"""One kind's encoder output: the merged features and the deepstack features (one array
per deepstack layer), rows in the order of that kind's tokens."""


@attrs.frozen
class DeepstackEncoding:
    """A Qwen3-VL request's vision-encoder output, per kind of medium.

    mlx-vlm's ``get_input_embeddings`` drops the deepstack features when it is given
    cached features, so the encoding cache keeps them here, beside the features.

    Attributes:
        image: the images' output (all images of the request, in prompt order), or
            ``None``.
        video: the videos' output, or ``None``.
    """

    image: Features | None
    video: Features | None

    def arrays(self) -> list[mx.array]:
        """Every array held (to evaluate them)."""
        return [a for f in (self.image, self.video) if f is not None for a in (f[0], *f[1])]

    def in_token_order(
        self, input_ids: mx.array, image_token: int, video_token: int
    ) -> tuple[mx.array, list[mx.array]]:
        """(features, deepstack features per layer) with one row per image or video token
        of ``input_ids``, in the order of those tokens: what mlx-vlm scatters into the
        embeddings and merges for the deepstack layers when it runs the encoder itself."""
        kinds = [f for f in (self.image, self.video) if f is not None]
        if not kinds:
            raise ValueError("a vision encoding without images or videos")
        if len(kinds) == 1:
            return kinds[0][0], list(kinds[0][1])
        assert self.image is not None and self.video is not None
        ids = np.array(input_ids).reshape(-1)
        is_video = ids[(ids == image_token) | (ids == video_token)] == video_token
        n_images, n_videos = int((~is_video).sum()), int(is_video.sum())
        if (n_images, n_videos) != (self.image[0].shape[0], self.video[0].shape[0]):
            raise ValueError(
                f"{n_images} image and {n_videos} video tokens for "
                f"{self.image[0].shape[0]} image and {self.video[0].shape[0]} video features"
            )
        order = np.empty(len(is_video), dtype=np.uint32)
        order[~is_video] = np.arange(n_images)
        order[is_video] = n_images + np.arange(n_videos)
        index = mx.array(order)

        def merged(image: mx.array, video: mx.array) -> mx.array:
            return mx.concatenate([image, video])[index]

        layers = [merged(i, v) for i, v in zip(self.image[1], self.video[1], strict=True)]
        return merged(self.image[0], self.video[0]), layers


class VisionEncodingCache:
    """Vision-encoder outputs of recent requests, keyed by the hashes of all their media's
    full bytes (images and videos, in prompt order). LRU, bounded in entries."""

    def __init__(self, max_entries: int = 32) -> None:
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[tuple[str, ...], Any] = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, ...]) -> Any:
        """The cached features for ``key`` or ``None`` (counts a hit or a miss)."""
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found

    def put(self, key: tuple[str, ...], features: Any) -> None:
        """Keep ``features`` for ``key`` (evicting the least recently used)."""
        if self.max_entries <= 0:
            return
        self._entries[key] = features
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class VisionPrefill(PrefillStrategy):
    """Routes each request: with media through the vision-language model, without
    through ``text`` (the chunked prefill of the text view).

    Args:
        model: the engine's model: the text view of the vision-language model, or
            mlx-lm's text model holding its language-model weights.
        vlm: the mlx-vlm model (vision tower, embedding merge, M-RoPE prefill).
        step_size: prefill chunk size (``--prefill-step-size``), for both paths.
        encoding_cache_size: how many image sets' vision encodings to keep.
    """

    name = "vision"

    def __init__(
        self, model: Any, vlm: Any, step_size: int = 2048, encoding_cache_size: int = 32
    ) -> None:
        self.model = model
        self.vlm = vlm
        # The engine's caches are mlx-lm's; mlx-vlm's language model runs on them directly
        # when it is the engine's model (the text view), and on its own cache classes when
        # the engine runs mlx-lm's text model (Qwen3.5): their state is then handed over.
        self.own_caches = vlm.language_model is not getattr(model, "language_model", None)
        self.step_size = step_size
        self.text = ChunkedPrefill(model, step_size)
        self.encodings = VisionEncodingCache(encoding_cache_size)
        self.requests = {"text": 0, "vision": 0}
        self.vision_tokens = 0

    def can_batch(self, task: PrefillTask) -> bool:
        """Text requests batch as the text path's chunked prefill allows; media never."""
        return task.request.media is None and self.text.can_batch(task)

    def prefill_batch(self, tasks: Sequence[PrefillTask]) -> list[PrefillResult]:
        results = self.text.prefill_batch(tasks)
        self.requests["text"] += len(tasks)
        for task in tasks:
            log.info("request %s: text path (batched prefill)", task.request.request_id)
        return results

    def stats(self) -> dict[str, float]:
        return {
            **{f"text_{k}": v for k, v in self.text.stats().items()},
            "vision_requests_text_path": self.requests["text"],
            "vision_requests_vision_path": self.requests["vision"],
            "vision_encoder_runs": self.encodings.misses,
            "vision_encoder_cache_hits": self.encodings.hits,
            "vision_encoder_cache_entries": len(self.encodings),
            "vision_prompt_tokens": self.vision_tokens,
        }

    def prefill(self, task: PrefillTask) -> PrefillGenerator:
        payload = task.request.media
        rid = task.request.request_id
        if payload is None:
            self.requests["text"] += 1
            log.info("request %s: text path (language model only)", rid)
            return (yield from self.text.prefill(task))
        if not isinstance(payload, VisionPayload):
            raise TypeError(f"request {rid}: unexpected media payload {type(payload).__name__}")
        self.requests["vision"] += 1
        return (yield from self._prefill_media(task, payload))

    def _prefill_media(self, task: PrefillTask, payload: VisionPayload) -> PrefillGenerator:
        start = task.start
        if start and task.request.cache_key is None:
            # Unkeyed placeholder tokens are the same for every image: a cached prefix may
            # hold another image's state, so such prompts are prefilled from the start.
            trim_prompt_cache(task.cache, start)
            start = 0
        arrays = {k: mx.array(v) for k, v in payload.inputs.items()}
        input_ids = arrays["input_ids"]
        pixel_values = arrays.get("pixel_values")
        mask = arrays.get("attention_mask")
        extra = {k: v for k, v in arrays.items() if k not in _NOT_SEQUENCE_INPUTS}
        key = payload.media_keys
        cached = self.encodings.get(key) if key else None
        reused = cached is not None
        if cached is None and key:
            cached = self._encode(pixel_values, extra)
            mx.eval(cached.arrays() if isinstance(cached, DeepstackEncoding) else cached)
            self.encodings.put(key, cached)
            yield start  # let the running batch take a decode step after the encoder
        log.info(
            "request %s: vision path (%d media parts, encoder %s)",
            task.request.request_id,
            len(key),
            "skipped: same media seen before" if reused else "ran",
        )
        lm = self.vlm.language_model
        cache = copy_cache_state(task.cache, lm.make_cache()) if self.own_caches else task.cache
        deepstack: list[mx.array] | None = None
        if isinstance(cached, DeepstackEncoding):
            config = self.vlm.config
            cached, deepstack = cached.in_token_order(
                input_ids, config.image_token_index, config.video_token_index
            )
        embedded = self.vlm.get_input_embeddings(
            input_ids, pixel_values, mask=mask, cached_image_features=cached, **extra
        )
        # The cache holds the first ``start`` positions (a prefix keyed by the same media):
        # continue after them; the full prompt's M-RoPE positions are sliced by offset.
        embeds = embedded.inputs_embeds[:, start:]
        input_ids = input_ids[:, start:]
        kwargs = {
            **extra,
            **{
                k: v
                for k, v in embedded.to_dict().items()
                if k != "inputs_embeds" and v is not None
            },
        }
        if deepstack is not None:
            # Indexed by the visual tokens of the whole prompt, like the visual mask: the
            # language model takes each chunk's rows by the cache offset.
            kwargs["deepstack_visual_embeds"] = deepstack
        done = 0
        while embeds.shape[1] > 1:
            n = min(self.step_size, embeds.shape[1] - 1)
            lm(
                inputs=input_ids[:, :n],
                inputs_embeds=embeds[:, :n],
                cache=cache,
                n_to_process=n,
                logits_to_keep=1,
                **kwargs,
            )
            mx.eval([c.state for c in cache])
            embeds, input_ids = embeds[:, n:], input_ids[:, n:]
            done += n
            yield done
        out = lm(input_ids[:, -1:], inputs_embeds=embeds, cache=cache, logits_to_keep=1, **kwargs)
        logits = out.logits[:, -1, :]
        if self.own_caches:
            copy_cache_state(cache, task.cache)
        deltas = kwargs.get("rope_deltas")
        shift = int(deltas.reshape(-1)[0].item()) if deltas is not None else 0
        self.vision_tokens += int(payload.inputs["input_ids"].shape[1])
        keyed = task.request.cache_key is not None
        return PrefillResult(logits=logits, reusable=keyed, position_offset=shift)

    def _encode(self, pixel_values: mx.array | None, extra: dict[str, Any]) -> Any:
        """Run the vision encoder on the images (or video frames) exactly as the model's
        ``get_input_embeddings`` would: the step the encoding cache lets a repeat skip."""
        vlm = self.vlm
        if vlm.config.model_type in DEEPSTACK_MODEL_TYPES:
            return self._encode_deepstack(pixel_values, extra)
        if vlm.config.model_type == "gemma3":
            assert pixel_values is not None
            dtype = vlm.language_model.model.embed_tokens(mx.array([0])).dtype
            hidden, _, _ = vlm.vision_tower(
                pixel_values.transpose(0, 2, 3, 1).astype(dtype), output_hidden_states=True
            )
            return vlm.multi_modal_projector(hidden)
        if pixel_values is None:
            pixel_values = extra["pixel_values_videos"]
        grid = extra.get("image_grid_thw")
        if grid is None:
            grid = extra["video_grid_thw"]
        dtype = vlm.vision_tower.patch_embed.proj.weight.dtype
        if vlm.config.model_type in ("qwen3_5", "qwen3_5_moe"):  # (features, deepstack features)
            features, _ = vlm.vision_tower(pixel_values.astype(dtype), grid)
            return features
        return vlm.vision_tower(pixel_values.astype(dtype), grid, output_hidden_states=False)

    def _encode_deepstack(
        self, pixel_values: mx.array | None, extra: dict[str, Any]
    ) -> DeepstackEncoding:
        """Qwen3-VL: the images and the videos each through the vision tower, as its
        ``get_input_embeddings`` runs them, keeping the deepstack features."""
        tower = self.vlm.vision_tower
        dtype = tower.patch_embed.proj.weight.dtype

        def encode(pixels: mx.array | None, grid: mx.array | None) -> Features | None:
            if pixels is None:
                return None
            features, deepstack = tower(pixels.astype(dtype), grid)
            return features, tuple(deepstack)

        return DeepstackEncoding(
            image=encode(pixel_values, extra.get("image_grid_thw")),
            video=encode(extra.get("pixel_values_videos"), extra.get("video_grid_thw")),
        )


def copy_cache_state(source: list[Any], target: list[Any]) -> list[Any]:
    """Give each ``target`` layer cache the state of the same layer in ``source`` (mlx-lm's
    and mlx-vlm's classes alike: attention caches by keys, values and offset, recurrent
    caches by their arrays); return ``target``. The arrays are shared, not copied."""
    if len(source) != len(target):
        raise ValueError(f"caches of {len(source)} and {len(target)} layers")
    for src, dst in zip(source, target, strict=True):
        if hasattr(src, "keys") and hasattr(dst, "keys"):
            dst.keys, dst.values, dst.offset = src.keys, src.values, src.offset
        elif isinstance(getattr(src, "cache", None), list) and hasattr(dst, "cache"):
            dst.cache = list(src.cache)
        else:
            raise TypeError(f"cannot hand a {type(src).__name__} over to a {type(dst).__name__}")
    return target
