"""Speech as the bytes of each of OpenAI's ``response_format`` values.

libsndfile (the ``soundfile`` wheel bundles it) writes WAV and FLAC (16-bit), MP3 and
Ogg Opus in-process; ``pcm`` is raw 16-bit little-endian samples at 24 kHz, the rate
OpenAI's clients assume. Opus takes 48 kHz, PCM 24 kHz: audio at another rate is
resampled (a polyphase filter, scipy). AAC has no encoder here: not offered.
"""

from __future__ import annotations

import io
import math

import numpy as np

MEDIA_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "flac": "audio/flac",
               "wav": "audio/wav", "pcm": "audio/pcm"}  # fmt: skip
"""The formats this server writes, and their media types."""
PCM_RATE = 24000
OPUS_RATE = 48000
_SOUNDFILE = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"),
              "mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}  # fmt: skip


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``samples`` at ``rate`` as ``target`` (unchanged when equal)."""
    if rate == target or samples.size == 0:
        return samples
    from scipy.signal import resample_poly

    common = math.gcd(rate, target)
    out = resample_poly(samples, target // common, rate // common)
    return np.asarray(out, dtype=np.float32)


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples as 16-bit little-endian integers, converted as libsndfile converts
    them for the file formats (rounded ``x * 32768``, clipped), so every format carries
    the same integers."""
    scaled = np.clip(np.rint(np.asarray(samples, dtype=np.float64) * 32768), -32768, 32767)
    return scaled.astype("<i2").tobytes()


def encode(samples: np.ndarray, rate: int, response_format: str) -> bytes:
    """The whole of ``samples`` (float32 mono at ``rate``) as ``response_format``."""
    if response_format == "pcm":
        return pcm16(resample(samples, rate, PCM_RATE))
    import soundfile

    container, subtype = _SOUNDFILE[response_format]
    if response_format == "opus":
        samples, rate = resample(samples, rate, OPUS_RATE), OPUS_RATE
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=container, subtype=subtype)
    return buffer.getvalue()


def wav_stream_header(rate: int) -> bytes:
    """The header of a 16-bit mono WAV file whose length is not known yet (the sizes say
    "as long as it goes", as streaming servers write them)."""
    unknown = 0xFFFFFFFF
    fmt = (16).to_bytes(4, "little") + (1).to_bytes(2, "little") + (1).to_bytes(2, "little")
    fmt += rate.to_bytes(4, "little") + (rate * 2).to_bytes(4, "little")
    fmt += (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    return (
        b"RIFF" + unknown.to_bytes(4, "little") + b"WAVE" + b"fmt " + fmt
        + b"data" + unknown.to_bytes(4, "little")
    )  # fmt: skip
