"""mlxcore plugin ``audio``: OpenAI's ``/v1/audio/transcriptions`` and
``/v1/audio/translations`` for Whisper models (``task = "stt"``) and ``/v1/audio/speech``
for mlx-audio's text-to-speech models (``task = "tts"``); such a folder is served for its
task whatever its models file says. Both load through mlx-audio and run in the engine as
jobs, a 30-second window or a spoken segment between two decode steps
(:mod:`mlxcore_audio.recognizer`, :mod:`mlxcore_audio.synthesizer`), under the memory
budget. Audio decodes and encodes in-process (miniaudio, libsndfile). See
docs/plugins/audio.md.
"""

from __future__ import annotations

from typing import Any

import attrs

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.hookspecs import OptionGroup
from mlxcore.models.loader import LoadedModel
from mlxcore.settings import add_flags, read_settings, seconds, setting


@attrs.frozen
class AudioSettings:
    """The audio plugin's settings; each default is stated here only."""

    max_audio_seconds: float = setting(
        3600.0, type=seconds, metavar="SECONDS",
        help="longest audio a transcription or translation takes (longer: a 400); the "
        "recognizer holds the decoded audio and its spectrogram, about 100 KB a second",
    )  # fmt: skip


_settings: list[AudioSettings] = []


def settings() -> AudioSettings:
    """The settings the server started with (the defaults before it configured)."""
    return _settings[-1] if _settings else AudioSettings()


@hookimpl
def mlxcore_addoption(parser: OptionGroup) -> None:
    """``--max-audio-seconds``."""
    add_flags(parser, AudioSettings)


@hookimpl
def mlxcore_configure(config: ServerConfig) -> None:
    """Keep the settings for the routes."""
    _settings.append(read_settings(config, AudioSettings))


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """The transcription, translation and speech routes."""
    from mlxcore_audio.routes import transcriptions, translations
    from mlxcore_audio.speech_routes import speech

    return [transcriptions, translations, speech]


@hookimpl
def mlxcore_load_model(model: Any, config: ServerConfig) -> LoadedModel | None:
    """Load Whisper and mlx-audio TTS checkpoints; pass on every other model."""
    from mlxcore_audio.loading import load_speech_model

    return load_speech_model(model.path, model.source)


@hookimpl
def mlxcore_model_architectures() -> list[str]:
    """The Whisper and TTS checkpoints this plugin loads (architectures, model types)."""
    from mlxcore_audio.loading import loaded_kinds

    return loaded_kinds()
