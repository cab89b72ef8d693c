"""Loading a vision-language checkpoint with mlx-vlm and exposing its text side to the engine.

The engine calls ``model(tokens, cache=...)`` and gets logits, the mlx-lm interface.
:class:`VisionLanguageText` gives that interface over mlx-vlm's own language model (the
same module object, so no weight is copied): text requests and every decode step run
through it, media requests prefill through the full vision-language model
(:mod:`mlxcore_vision.prefill`). Positions are passed explicitly: the row's cache offset,
which for a media sequence includes its M-RoPE shift (see
:attr:`mlxcore.engine.strategies.PrefillResult.position_offset`).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcore.config import ServerConfig
from mlxcore.models import LoadedModel, ModelLoadError, ResolvedModel
from mlxcore.models.folder import read_config, read_weight_keys
from mlxcore.models.loader import describe_model
from mlxcore_vision.settings import vision_settings

log = logging.getLogger("mlxcore.plugins.vision")

_VISION_WEIGHT_MARKERS = ("vision_tower.", "visual.", "vision_model.", "multi_modal_projector.")

SUPPORTED_MODEL_TYPES = frozenset(
    {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "gemma3"}
)
"""Families whose prefill and positions this plugin implements: Qwen-VL (M-RoPE,
native video; Qwen3-VL also deepstack and images with videos in one request), Qwen3.5
(M-RoPE, native video, hybrid GatedDeltaNet layers) and Gemma 3 (plain RoPE,
sliding-window layers)."""

MLX_LM_TEXT_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_moe"})
"""Families whose text side the engine runs on mlx-lm's own model class (sharing the
vision-language model's arrays): the Qwen3.5 decoder plugins (MTP) are built on it."""

VLM_ATTR = "mlxcore_vlm"
"""The attribute of the engine's model that holds its :class:`VLMRef`."""


class VLMRef:
    """The vision-language model a text model belongs to.

    A plain object, not an ``nn.Module``: hung on an mlx-lm model it must not make the
    vision-language model's parameters appear among the text model's.
    """

    def __init__(self, vlm: Any) -> None:
        self.vlm = vlm


def vlm_of(model: Any) -> Any | None:
    """The mlx-vlm model behind the engine's ``model``, or ``None`` for a text model."""
    ref = getattr(model, VLM_ATTR, None)
    return ref.vlm if isinstance(ref, VLMRef) else None


def is_vision_checkpoint(path: Path, config: dict[str, Any]) -> bool:
    """A folder holds a vision-language model: a ``vision_config`` and vision weights."""
    if "vision_config" not in config:
        return False
    keys = read_weight_keys(path)
    return any(marker in key for key in keys for marker in _VISION_WEIGHT_MARKERS)


def mlx_vlm_knows(model_type: str) -> bool:
    """mlx-vlm has a model module for ``model_type``."""
    try:
        return importlib.util.find_spec(f"mlx_vlm.models.{model_type}") is not None
    except (ImportError, ValueError):
        return False


class VisionLanguageText(nn.Module):
    """The text-only view of a vision-language model, in mlx-lm's calling convention.

    Args:
        vlm: the mlx-vlm model; its ``language_model`` is used as is (shared weights).
    """

    def __init__(self, vlm: Any) -> None:
        super().__init__()
        self.vlm = vlm
        setattr(self, VLM_ATTR, VLMRef(vlm))
        self.mrope = callable(getattr(vlm.language_model, "get_rope_index", None))

    @property
    def language_model(self) -> Any:
        """mlx-vlm's language model (the weights the text path runs on)."""
        return self.vlm.language_model

    @property
    def layers(self) -> Any:
        """The decoder layers (``make_prompt_cache`` builds one cache per layer)."""
        return self.vlm.language_model.layers

    def make_cache(self) -> list[Any]:
        """One mlx-lm cache per layer, of the kinds the language model asks for (sliding
        windows stay windows); mlx-lm caches, so that the engine can batch them."""
        from mlx_lm.models.cache import KVCache, RotatingKVCache

        wanted = getattr(self.vlm.language_model, "make_cache", None)
        if not callable(wanted):
            return [KVCache() for _ in self.layers]
        caches: list[Any] = []
        for cache in wanted():
            if type(cache).__name__ == "RotatingKVCache":
                caches.append(RotatingKVCache(max_size=cache.max_size, keep=cache.keep))
            elif type(cache).__name__ == "KVCache":
                caches.append(KVCache())
            else:
                raise ValueError(f"unsupported cache type {type(cache).__name__} in this model")
        return caches

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        """Logits for ``inputs`` (batch, length), continuing ``cache``."""
        if not self.mrope:
            plain: mx.array = self.vlm.language_model(inputs, cache=cache).logits
            return plain
        batch, length = inputs.shape
        offset = cache[0].offset if cache else 0
        steps = mx.arange(length)
        if isinstance(offset, mx.array):
            positions = offset.reshape(-1, 1) + steps[None]
        else:
            positions = mx.broadcast_to((steps + int(offset))[None], (batch, length))
        # M-RoPE takes (temporal, height, width) positions; text has all three equal.
        position_ids = mx.broadcast_to(positions[None], (3, batch, length))
        out = self.vlm.language_model(inputs, cache=cache, position_ids=position_ids)
        logits: mx.array = out.logits
        return logits


def load_vision_model(model: ResolvedModel, config: ServerConfig) -> LoadedModel | None:
    """Load ``model`` with mlx-vlm when it is a vision-language checkpoint (or ``--mllm``).

    Returns ``None`` for text checkpoints, which mlx-lm then loads as usual.
    """
    path = model.path
    cfg = read_config(path)
    forced = vision_settings(config).mllm
    if not forced and not is_vision_checkpoint(path, cfg):
        return None
    model_type = str(cfg.get("model_type", ""))
    if not mlx_vlm_knows(model_type):
        if forced:
            raise ModelLoadError(f"--mllm: mlx-vlm has no model {model_type!r} ({path})")
        return None
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        if forced:
            raise ModelLoadError(
                f"--mllm: vision-language model {model_type!r} ({path}) is not supported by "
                f"the vision plugin yet (supported: {supported})"
            )
        log.warning(
            "%s is a %s vision-language checkpoint; the vision plugin supports only %s so "
            "far: serving it text-only through mlx-lm",
            path,
            model_type,
            supported,
        )
        return None
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm import load as vlm_load

    from mlxcore_vision.media import VisionMedia

    try:
        vlm, processor = vlm_load(str(path))
        eos = cfg.get("eos_token_id")
        tokenizer = load_tokenizer(path, eos_token_ids=[eos] if isinstance(eos, int) else eos)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load vision model {path}: {type(exc).__name__}: {exc}"
        ) from exc
    info = describe_model(path, cfg, tokenizer, source=model.source)
    text_model: nn.Module
    if model_type in MLX_LM_TEXT_MODEL_TYPES:
        text_model = share_mlx_lm_text_model(path, vlm)
    else:
        text_model = VisionLanguageText(vlm)
    media = VisionMedia.from_config(vlm, processor, config)
    log.info("loaded vision-language model %s (%s) with mlx-vlm", path, model_type)
    return LoadedModel(model=text_model, tokenizer=tokenizer, info=info, media=media)


def share_mlx_lm_text_model(path: Path, vlm: Any) -> nn.Module:
    """mlx-lm's text model for the checkpoint at ``path``, holding ``vlm``'s language-model
    arrays (the same array objects: nothing is copied, nothing is read twice).

    mlx-lm builds the module tree lazily (its own weight arrays are never evaluated),
    then every parameter is replaced by the one of the same name in mlx-vlm's language
    model; names or shapes that do not line up fail the load.
    """
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import load_model

    try:
        text_model, _ = load_model(path, lazy=True)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot build mlx-lm's text model for {path}: {type(exc).__name__}: {exc}"
        ) from exc
    theirs: dict[str, mx.array] = dict(tree_flatten(vlm.language_model.parameters()))
    target: Any = getattr(text_model, "language_model", text_model)
    mine: dict[str, mx.array] = dict(tree_flatten(target.parameters()))
    if mine.keys() != theirs.keys():
        raise ModelLoadError(
            f"{path}: mlx-lm's and mlx-vlm's language models differ in parameters: "
            f"{sorted(mine.keys() ^ theirs.keys())[:5]}"
        )
    wrong = [k for k, v in mine.items() if v.shape != theirs[k].shape]
    if wrong:
        raise ModelLoadError(
            f"{path}: parameter shapes differ between mlx-lm and mlx-vlm: {wrong[:5]}"
        )
    target.update(tree_unflatten(list(theirs.items())))
    setattr(text_model, VLM_ATTR, VLMRef(vlm))
    return text_model
