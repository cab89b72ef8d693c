"""Text to speech as engine work: an mlx-audio TTS model's ``generate``, one of its
segments (a sentence or a group of them) per piece, on the synthesis's own random key.

The model is any mlx-audio TTS model (``mlx_audio.tts``: Soprano, Kokoro, ...); this
module calls its ``generate`` as mlx-audio's own ``generate_audio`` does and passes a
request's voice, speed and instructions only where that ``generate`` takes them (a
request that asks for more is refused before any work: :meth:`SpeechSynthesizer.refuse`).
For the same text, voice and seed the samples are the ones the model gives in process
after ``mx.random.seed(seed)`` (tests/plugins/audio/test_speech_server.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import attrs
import mlx.nn as nn
import numpy as np

from mlxcore_audio.own_random import OwnRandom

MAX_INPUT_CHARS = 4096
"""Longest text one request speaks (OpenAI's limit)."""
BYTES_PER_CHAR = 16 * 1024
"""What a character of text may cost while it is spoken: its audio (float32 at up to
48 kHz, about 15 characters a second) and the decoder's activations for its tokens."""
BASE_BYTES = 64 * 1024 * 1024
"""A segment's language-model caches and decoder activations beside that."""


@attrs.define
class Speech:
    """A synthesis's result: float32 mono samples at ``sample_rate``."""

    samples: np.ndarray
    sample_rate: int


class SpeechSynthesizer(nn.Module):
    """A loaded mlx-audio TTS model as the server serves it: text to speech only."""

    mlxcore_task = "tts"
    """What the server serves it for, whatever its models file says (it cannot chat)."""

    def __init__(self, tts: Any, path: Path) -> None:
        super().__init__()
        self.tts = tts
        """mlx-audio's TTS ``Model`` (its weights are this module's)."""
        self._parameters = frozenset(inspect.signature(tts.generate).parameters)
        found = sorted(p.stem for p in (path / "voices").glob("*.safetensors"))
        self._voices = found or None

    @property
    def sample_rate(self) -> int:
        """The rate of the audio the model makes."""
        return int(self.tts.sample_rate)

    def takes(self, name: str) -> bool:
        """Whether the model's ``generate`` has the parameter ``name``."""
        return name in self._parameters

    def voices(self) -> list[str] | None:
        """The voices the checkpoint ships (``voices/NAME.safetensors``, Kokoro's
        layout); ``None`` when it names none (the model takes any or ignores it). Read once,
        at load."""
        return self._voices

    def refuse(self, voice: str | None, speed: float, instructions: str | None) -> str | None:
        """Why the model cannot do what a request asks (``None``: it can), as
        ``"field: reason"`` (no voice: the model's default one)."""
        known = self.voices()
        if known is not None and voice is not None and voice not in known:
            return f"voice: this model's voices are {', '.join(known)}"
        if speed != 1.0 and not self.takes("speed"):
            return "speed: this model speaks at one speed only (leave speed at 1.0)"
        if instructions and not self.takes("instruct"):
            return "instructions: this model takes no instructions"
        return None


def synthesis_bytes(text: str) -> int:
    """An estimate of what speaking ``text`` holds at once."""
    return BASE_BYTES + len(text) * BYTES_PER_CHAR


def synthesize(
    model: SpeechSynthesizer,
    text: str,
    *,
    voice: str | None = None,
    speed: float = 1.0,
    instructions: str | None = None,
    seed: int = 0,
    on_audio: Callable[[np.ndarray], None] | None = None,
) -> Generator[None, None, Speech]:
    """Speak ``text``, one of the model's segments per ``next``; ``on_audio`` hears each
    segment's samples as it is made. Returns the whole :class:`Speech`."""
    kwargs: dict[str, Any] = {"text": text, "voice": voice}
    if model.takes("verbose"):
        kwargs["verbose"] = False
    if speed != 1.0:
        kwargs["speed"] = speed
    if instructions:
        kwargs["instruct"] = instructions
    draws = OwnRandom(seed)
    with draws.active():
        results = iter(model.tts.generate(**kwargs))
    pieces: list[np.ndarray] = []
    while True:
        with draws.active():
            result = next(results, None)
        if result is None:
            break
        samples = np.asarray(result.audio, dtype=np.float32).reshape(-1)
        pieces.append(samples)
        if on_audio is not None:
            on_audio(samples)
        yield
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    return Speech(audio, model.sample_rate)
