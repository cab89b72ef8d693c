"""A Whisper checkpoint as a model the server serves: mlx-audio's loader, its tokenizer
wrapped as mlx-lm's (for the :class:`~mlxcore.model_info.ModelInfo` every model has)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mlxcore.errors import ModelLoadError
from mlxcore.models.folder import read_config
from mlxcore.models.loader import LoadedModel, describe_model
from mlxcore_audio.recognizer import SpeechRecognizer

log = logging.getLogger("mlxcore.plugins.audio")

ARCHITECTURES = frozenset({"WhisperForConditionalGeneration"})
"""The speech-to-text checkpoints this plugin loads (``config.json``'s ``architectures``;
mlx-community's conversions say ``model_type = "whisper"`` only)."""


def is_whisper(config: dict[str, Any]) -> bool:
    """Whether ``config`` (a ``config.json``) describes a Whisper checkpoint."""
    named = ARCHITECTURES.intersection(config.get("architectures") or ())
    return bool(named) or config.get("model_type") == "whisper"


def load_speech_model(path: Path, source: str = "") -> LoadedModel | None:
    """The Whisper model in ``path``, or ``None`` when it holds another kind of model."""
    config = read_config(path)
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
