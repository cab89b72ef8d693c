"""Whisper and mlx-audio TTS checkpoints as models the server serves: mlx-audio's
loaders, their tokenizers wrapped as mlx-lm's (for the
:class:`~mlxcore.model_info.ModelInfo` every model has)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mlxcore.errors import ModelLoadError
from mlxcore.models.folder import read_config
from mlxcore.models.loader import LoadedModel, describe_model
from mlxcore_audio.recognizer import SpeechRecognizer
from mlxcore_audio.synthesizer import SpeechSynthesizer

log = logging.getLogger("mlxcore.plugins.audio")

ARCHITECTURES = frozenset({"WhisperForConditionalGeneration"})
"""The speech-to-text checkpoints this plugin loads (``config.json``'s ``architectures``;
mlx-community's conversions say ``model_type = "whisper"`` only)."""


def is_whisper(config: dict[str, Any]) -> bool:
    """Whether ``config`` (a ``config.json``) describes a Whisper checkpoint."""
    named = ARCHITECTURES.intersection(config.get("architectures") or ())
    return bool(named) or config.get("model_type") == "whisper"


TTS_TYPES_BESIDE_MLX_AUDIOS_MAP = frozenset({"kokoro"})
"""TTS ``model_type`` values mlx-audio loads by folder name rather than by its map.
(Names it shares with language models, ``llama`` or ``qwen3``, are never taken for TTS.)"""


def is_tts(config: dict[str, Any]) -> bool:
    """Whether ``config`` names one of mlx-audio's text-to-speech models."""
    from mlx_audio.tts.utils import MODEL_REMAPPING

    kind = config.get("model_type")
    return kind in MODEL_REMAPPING or kind in TTS_TYPES_BESIDE_MLX_AUDIOS_MAP


def loaded_kinds() -> list[str]:
    """The architectures and model types this plugin loads (for the folder check)."""
    from mlx_audio.tts.utils import MODEL_REMAPPING

    return sorted({*ARCHITECTURES, "whisper", *MODEL_REMAPPING, *TTS_TYPES_BESIDE_MLX_AUDIOS_MAP})


def load_speech_model(path: Path, source: str = "") -> LoadedModel | None:
    """The Whisper or TTS model in ``path``, or ``None`` when it holds another kind."""
    config = read_config(path)
    if is_tts(config):
        return load_tts(path, config, source)
    if not is_whisper(config):
        return None
    from mlx_audio.stt import load
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    try:
        whisper = load(path)
        processor = getattr(whisper, "_processor", None)
        if processor is None:
            raise ModelLoadError("it has no Whisper tokenizer (tokenizer and processor files)")
        tokenizer = TokenizerWrapper(processor.tokenizer)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise ModelLoadError(f"cannot load Whisper model {path}: {reason}") from exc
    log.info("loaded Whisper %s (%s)", source or path, whisper.dtype)
    info = describe_model(path, config, tokenizer, source=source)
    return LoadedModel(SpeechRecognizer(whisper), tokenizer, info)


def load_tts(path: Path, config: dict[str, Any], source: str) -> LoadedModel:
    """mlx-audio's TTS model in ``path`` (its own loader, its own tokenizer)."""
    from mlx_audio.tts.utils import load_model
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from transformers import AutoTokenizer

    try:
        tts = load_model(path)
        hf = getattr(tts, "tokenizer", None)
        if hf is None or not hasattr(hf, "get_vocab"):
            hf = AutoTokenizer.from_pretrained(str(path))
        tokenizer = TokenizerWrapper(hf)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise ModelLoadError(f"cannot load text-to-speech model {path}: {reason}") from exc
    log.info("loaded text-to-speech model %s (%s)", source or path, config.get("model_type"))
    info = describe_model(path, config, tokenizer, source=source)
    return LoadedModel(SpeechSynthesizer(tts, path), tokenizer, info)
