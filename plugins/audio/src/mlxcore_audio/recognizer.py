"""Whisper speech recognition as engine work: the audio's 30-second windows one at a time.

mlx-audio's Whisper (``mlx_audio.stt.models.whisper``) gives the model, its decoding of
one window (``model.decode``: the prompt, the timestamp rules, greedy or sampled) and the
word alignment (``add_word_timestamps``). What its ``generate`` does around them — walk
the log-Mel spectrogram window by window, retry a window at higher temperatures when its
text is too repetitive or too improbable, skip silence, cut the output into timed
segments at timestamp tokens, carry the text so far as the next window's prompt — is done
here as a generator that yields after each window, so that the engine runs a long
recording between its decode steps (one window per piece) and a stream can send each
window's text as soon as it is decoded. For the same audio and options the segments and
text are the ones ``generate`` gives after ``mx.random.seed(0)``
(tests/plugins/audio/test_recognizer.py compares them): a recognition draws from its own
random key, so a retried window samples the same way whatever the engine did between.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxcore_audio.own_random import OwnRandom

SAMPLE_RATE = 16000
"""Whisper hears 16 kHz mono."""
HOP = 160
"""Audio samples per spectrogram frame (10 ms)."""
WINDOW_FRAMES = 3000
"""Spectrogram frames per window the encoder reads (30 s)."""
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Temperatures tried in turn when a window's decoding fails the quality checks (what
OpenAI's ``temperature=0`` means for Whisper)."""
COMPRESSION_LIMIT = 2.4
"""A window whose text gzip-compresses better than this is a repetition loop: retried."""
LOGPROB_LIMIT = -1.0
"""A window whose tokens' mean log-probability is below this is retried..."""
NO_SPEECH_LIMIT = 0.6
"""...unless its no-speech probability is above this: then it is silence, skipped."""
PREPEND_PUNCTUATION = "\"'\u201c\u00bf([{-"
APPEND_PUNCTUATION = "\"'.\u3002,\uff0c!\uff01?\uff1f:\uff1a\u201d)]}\u3001"


@attrs.frozen
class Options:
    """What a request asks of the recognizer.

    Attributes:
        task: ``transcribe`` or ``translate`` (into English).
        language: the spoken language's code (``None``: detected from the first window).
        prompt: text that conditions the first window (spellings, names, style).
        temperatures: tried in turn per window (one value: no fallback).
        timestamps: segment timestamps (off: one untimed segment per window).
        words: word timestamps too (from the cross-attention alignment).
        seed: where the recognition's own random numbers start (the draws of a window
            retried at a higher temperature): the same audio gives the same transcript,
            whatever else the engine samples meanwhile.
    """

    task: str = "transcribe"
    language: str | None = None
    prompt: str | None = None
    temperatures: tuple[float, ...] = FALLBACK_TEMPERATURES
    timestamps: bool = True
    words: bool = False
    seed: int = 0


@attrs.define
class Transcript:
    """A recognizer's result: the text, its segments (mlx-audio's segment dicts: id,
    seek, start, end, text, tokens, temperature, avg_logprob, compression_ratio,
    no_speech_prob, and ``words`` when asked), the language and the audio's length."""

    text: str
    segments: list[dict[str, Any]]
    language: str
    duration: float


class SpeechRecognizer(nn.Module):
    """A loaded Whisper model as the server serves it: speech to text only."""

    mlxcore_task = "stt"
    """What the server serves it for, whatever its models file says (it cannot chat)."""

    def __init__(self, whisper: Any) -> None:
        super().__init__()
        self.whisper = whisper
        """mlx-audio's Whisper ``Model`` (its weights are this module's)."""

    @property
    def dims(self) -> Any:
        """The model's shape (mlx-audio's ``ModelDimensions``)."""
        return self.whisper.dims

    def tokenizer(self, language: str | None, task: str) -> Any:
        """mlx-audio's tokenizer wrapper for ``language`` and ``task``."""
        return self.whisper.get_tokenizer(language=language, task=task)


def languages() -> dict[str, str]:
    """Whisper's language codes and their English names (``en`` -> ``english``)."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    return dict(LANGUAGES)


def language_code(name: str) -> str | None:
    """The code of a language given by code or English name (``None``: not Whisper's)."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    key = name.strip().lower()
    if key in LANGUAGES:
        return key
    return TO_LANGUAGE_CODE.get(key)


def recognition_bytes(model: SpeechRecognizer, samples: int) -> int:
    """An upper estimate of what recognizing ``samples`` audio samples holds at once:
    the samples and the padded spectrogram (float32), one window's encoder activations
    and attention scores, the decoder's caches."""
    dims = model.dims
    frames = samples // HOP + WINDOW_FRAMES + 1
    spectrogram = frames * dims.n_mels * 4
    ctx = dims.n_audio_ctx
    encoder = ctx * dims.n_audio_state * 4 * 16 + ctx * ctx * dims.n_audio_head * 4 * 2
    decoder = 2 * dims.n_text_layer * dims.n_text_ctx * dims.n_text_state * 4 * 2
    cross = 2 * dims.n_text_layer * ctx * dims.n_text_state * 4
    return samples * 4 + spectrogram + encoder + decoder + cross


def recognize(
    model: SpeechRecognizer,
    audio: np.ndarray | Callable[[], np.ndarray],
    options: Options,
    on_segments: Callable[[list[dict[str, Any]], str], None] | None = None,
) -> Generator[None, None, Transcript]:
    """Recognize ``audio`` (16 kHz mono float32 samples, or a function that decodes
    them on the engine thread), one window per ``next``; ``on_segments(segments,
    text)`` hears each window's new segments and the transcript's text so far. Returns
    the :class:`Transcript`."""
    from mlx_audio.stt.models.whisper.audio import log_mel_spectrogram

    samples = audio() if callable(audio) else audio
    mel = log_mel_spectrogram(mx.array(samples), n_mels=model.dims.n_mels, padding=480000)
    frames = int(mel.shape[-2]) - WINDOW_FRAMES
    language = options.language or _detect_language(model, mel)
    yield
    walk = _Walk(model, mel, frames, language, options)
    draws = OwnRandom(options.seed)
    while walk.seek < frames:
        with draws.active():
            new = walk.window()
        if new and on_segments is not None:
            on_segments(new, walk.text())
        yield
    mx.clear_cache()
    duration = len(samples) / SAMPLE_RATE
    return Transcript(walk.text(), walk.segments, language, duration)


def _detect_language(model: SpeechRecognizer, mel: mx.array) -> str:
    """The most likely language of the first window (``en`` for English-only models)."""
    from mlx_audio.stt.models.whisper.audio import pad_or_trim

    whisper = model.whisper
    if not whisper.is_multilingual:
        return "en"
    first = pad_or_trim(mel, WINDOW_FRAMES, axis=-2).astype(whisper.dtype)
    _, probs = whisper.detect_language(first)
    return str(max(probs, key=probs.get))


class _Walk:
    """The state of one recognition between windows."""

    def __init__(
        self, model: SpeechRecognizer, mel: mx.array, frames: int, language: str, options: Options
    ) -> None:
        self.whisper = model.whisper
        self.mel = mel
        self.frames = frames
        self.options = options
        self.tokenizer = model.tokenizer(language, options.task)
        self.base: dict[str, Any] = {"language": language, "task": options.task}
        self.base["without_timestamps"] = not (options.timestamps or options.words)
        self.seek = 0
        self.tokens: list[int] = []
        self.segments: list[dict[str, Any]] = []
        self.prompt_from = 0
        self.last_speech = 0.0
        if options.prompt is not None:
            self.tokens.extend(self.tokenizer.encode(" " + options.prompt.strip()))
        self.prompt_tokens = len(self.tokens)

    def text(self) -> str:
        """The transcript's text so far."""
        return str(self.tokenizer.decode(self.tokens[self.prompt_tokens :]))

    def window(self) -> list[dict[str, Any]]:
        """Decode the window at :attr:`seek`, move on; the segments it added."""
        from mlx_audio.stt.models.whisper.audio import pad_or_trim

        start = self.seek
        size = min(WINDOW_FRAMES, self.frames - start)
        offset = start * HOP / SAMPLE_RATE
        mel = self.mel[start : start + size]
        mel = pad_or_trim(mel, WINDOW_FRAMES, axis=-2).astype(self.whisper.dtype)
        result = self._decode(mel, self.tokens[self.prompt_from :])
        if result.no_speech_prob > NO_SPEECH_LIMIT and not result.avg_logprob > LOGPROB_LIMIT:
            self.seek = start + size  # silence
            return []
        tokens = np.array(result.tokens)
        current, ended = self._split(tokens, result, start, size, offset)
        if self.options.words:
            self._align(current, mel, size, offset, ended)
        for segment in current:
            if segment["start"] == segment["end"] or not segment["text"].strip():
                segment.update(text="", tokens=[], words=[])
        first = len(self.segments)
        added = [{"id": first + i, **segment} for i, segment in enumerate(current)]
        self.segments.extend(added)
        self.tokens.extend(t for segment in current for t in segment["tokens"])
        if result.temperature > 0.5:  # a hot window's text is no prompt for the next
            self.prompt_from = len(self.tokens)
        return added

    def _decode(self, mel: mx.array, prompt: list[int]) -> Any:
        """The window decoded at the first temperature whose result passes the checks."""
        from mlx_audio.stt.models.whisper.decoding import DecodingOptions

        result: Any = None
        for temperature in self.options.temperatures:
            options = DecodingOptions(**self.base, prompt=prompt, temperature=temperature)
            result = self.whisper.decode(mel, options)
            failed = (
                result.compression_ratio > COMPRESSION_LIMIT or result.avg_logprob < LOGPROB_LIMIT
            )
            silent = result.no_speech_prob > NO_SPEECH_LIMIT and result.avg_logprob < LOGPROB_LIMIT
            if not failed or silent:
                break
        return result

    def _split(
        self, tokens: np.ndarray, result: Any, start: int, size: int, offset: float
    ) -> tuple[list[dict[str, Any]], bool]:
        """The window's segments (cut at pairs of timestamp tokens) and whether its
        output ended on a single timestamp (nothing unfinished); sets :attr:`seek`."""
        first_time = self.tokenizer.timestamp_begin
        step = 2 * HOP / SAMPLE_RATE  # seconds per timestamp unit (0.02)
        is_time = tokens >= first_time
        ended = is_time[-2:].tolist() == [False, True]
        cuts = (np.where(is_time[:-1] & is_time[1:])[0] + 1).tolist()
        segments: list[dict[str, Any]] = []
        if cuts:
            if ended:
                cuts.append(len(tokens))
            last = 0
            for cut in cuts:
                piece = tokens[last:cut]
                begin = offset + (int(piece[0]) - first_time) * step
                end = offset + (int(piece[-1]) - first_time) * step
                segments.append(self._segment(start, begin, end, piece, result))
                last = cut
            if ended:
                self.seek = start + size
            else:  # the unfinished segment is decoded again from its start
                self.seek = start + (int(tokens[last - 1]) - first_time) * 2
            return segments, ended
        length = size * HOP / SAMPLE_RATE
        times = tokens[is_time.nonzero()[0]]
        if len(times) > 0 and int(times[-1]) != first_time:
            length = (int(times[-1]) - first_time) * step
        segments.append(self._segment(start, offset, offset + length, tokens, result))
        self.seek = start + size
        return segments, ended

    def _segment(
        self, seek: int, start: float, end: float, tokens: np.ndarray, result: Any
    ) -> dict[str, Any]:
        ids = tokens.tolist()
        return {
            "seek": seek,
            "start": float(start),
            "end": float(end),
            "text": self.tokenizer.decode([t for t in ids if t < self.tokenizer.eot]),
            "tokens": ids,
            "temperature": result.temperature,
            "avg_logprob": result.avg_logprob,
            "compression_ratio": result.compression_ratio,
            "no_speech_prob": result.no_speech_prob,
        }

    def _align(
        self,
        segments: list[dict[str, Any]],
        mel: mx.array,
        size: int,
        offset: float,
        ended: bool,
    ) -> None:
        """Word timestamps for ``segments``; an unfinished window resumes after its
        last word."""
        from mlx_audio.stt.models.whisper.timing import add_word_timestamps

        add_word_timestamps(
            segments=segments,
            model=self.whisper,
            tokenizer=self.tokenizer,
            mel=mel,
            num_frames=size,
            prepend_punctuations=PREPEND_PUNCTUATION,
            append_punctuations=APPEND_PUNCTUATION,
            last_speech_timestamp=self.last_speech,
        )
        last_end = _last_word_end(segments)
        if not ended and last_end is not None and last_end > offset:
            self.seek = round(last_end * SAMPLE_RATE / HOP)
        if last_end is not None:
            self.last_speech = last_end


def _last_word_end(segments: list[dict[str, Any]]) -> float | None:
    """When the last word of ``segments`` ends; without words, when the last segment
    does (``None``: no segments)."""
    for segment in reversed(segments):
        words = segment.get("words") or []
        if words:
            return float(words[-1]["end"])
    return float(segments[-1]["end"]) if segments else None
