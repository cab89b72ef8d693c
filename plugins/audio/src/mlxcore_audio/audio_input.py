"""Uploaded audio: what it is and how long, checked before any work is queued, and its
samples, decoded when the work runs.

WAV, MP3 and FLAC decode in-process through miniaudio (mlx-audio's reader, so the samples
are the ones mlx-audio's own ``load_audio`` gives for the same file: 16 kHz mono
float32); Ogg (Vorbis or Opus, what browsers and phones record) through libsndfile (the
``soundfile`` wheel), averaged to mono and resampled to 16 kHz. WebM and MP4/M4A need
the ``ffmpeg`` program, which mlx-audio's reader calls when it is on ``PATH``; without it
they are refused with a clear error. Nothing here goes to the network.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import attrs
import numpy as np

from mlxcore_audio.recognizer import SAMPLE_RATE

IN_PROCESS = ("wav", "mp3", "flac", "ogg")
"""Formats decoded without ffmpeg."""

Audio = bytes | Path
"""An upload: its bytes, or the file it was spooled to (a queued request holds no audio
in memory)."""


def _head(audio: Audio) -> bytes:
    if isinstance(audio, bytes):
        return audio[:12]
    with audio.open("rb") as file:
        return file.read(12)


def _size(audio: Audio) -> int:
    return len(audio) if isinstance(audio, bytes) else audio.stat().st_size


def _opened(audio: Audio) -> io.BytesIO | str:
    """What the readers open: the bytes as a file, or the file's path."""
    return io.BytesIO(audio) if isinstance(audio, bytes) else str(audio)


class AudioError(Exception):
    """Audio that cannot be used: empty, corrupt, of an unsupported format, too long."""

    def __init__(self, message: str, code: str = "invalid_audio") -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class Probe:
    """What an upload holds, read from its headers (``seconds`` is ``None`` for a
    format only ffmpeg reads: its length is known once decoded)."""

    format: str
    seconds: float | None


def sniff(head: bytes) -> str | None:
    """The container an upload's first bytes name (``None``: none this reader knows)."""
    head = head[:12]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    frame = len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
    if head[:3] == b"ID3" or (frame and head[1] & 0x06 != 0):
        return "mp3"  # an ID3 tag, or an MPEG audio frame (layer bits 00 would be AAC)
    if head[:4] == b"OggS":
        return "ogg"
    if head[4:8] == b"ftyp":
        return "m4a"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    return None


def probe(audio: Audio, max_seconds: float) -> Probe:
    """The upload's format and length; :class:`AudioError` when it is empty, not audio
    this server reads, corrupt, or longer than ``max_seconds``."""
    if _size(audio) == 0:
        raise AudioError("the audio file is empty", "empty_audio")
    kind = sniff(_head(audio))
    if kind is None:
        raise AudioError(
            "the file is not audio in a format this server reads (wav, mp3, flac, ogg; "
            "webm and m4a with ffmpeg installed)",
            "unsupported_audio_format",
        )
    if kind not in IN_PROCESS:
        if shutil.which("ffmpeg") is None:
            raise AudioError(
                f"{kind} audio needs ffmpeg, which this server does not have; send wav, "
                "mp3, flac or ogg",
                "unsupported_audio_format",
            )
        return Probe(kind, None)
    if kind == "ogg":
        return _probe_ogg(audio, max_seconds)
    import miniaudio

    if isinstance(audio, bytes):
        readers = {"wav": miniaudio.wav_get_info, "mp3": miniaudio.mp3_get_info,
                   "flac": miniaudio.flac_get_info}  # fmt: skip
        source: bytes | str = audio
    else:
        readers = {"wav": miniaudio.wav_get_file_info, "mp3": miniaudio.mp3_get_file_info,
                   "flac": miniaudio.flac_get_file_info}  # fmt: skip
        source = str(audio)
    try:
        info = readers[kind](source)
    except (miniaudio.DecodeError, RuntimeError) as exc:
        raise AudioError(f"cannot read the {kind} audio: {exc}") from None
    if info.num_frames <= 0 or info.sample_rate <= 0:
        raise AudioError(f"the {kind} file holds no audio", "empty_audio")
    seconds = info.num_frames / info.sample_rate
    check_length(seconds, max_seconds)
    return Probe(kind, seconds)


def _probe_ogg(audio: Audio, max_seconds: float) -> Probe:
    import soundfile

    try:
        info = soundfile.info(_opened(audio))
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioError(f"cannot read the ogg audio: {exc}") from None
    if info.frames <= 0 or info.samplerate <= 0:
        raise AudioError("the ogg file holds no audio", "empty_audio")
    seconds = info.frames / info.samplerate
    check_length(seconds, max_seconds)
    return Probe("ogg", seconds)


def _decode_ogg(audio: Audio) -> np.ndarray:
    """Ogg Vorbis or Opus as 16 kHz mono float32 (libsndfile, then a polyphase filter)."""
    import soundfile

    from mlxcore_audio.encoding import resample

    try:
        frames, rate = soundfile.read(_opened(audio), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioError(f"cannot decode the audio: {exc}") from None
    mono = np.asarray(frames.mean(axis=1), dtype=np.float32)
    return resample(mono, int(rate), SAMPLE_RATE)


def check_length(seconds: float, max_seconds: float) -> None:
    """:class:`AudioError` when ``seconds`` of audio is more than ``max_seconds``."""
    if seconds > max_seconds:
        raise AudioError(
            f"the audio lasts {seconds:.0f} s, more than this server's limit of "
            f"{max_seconds:.0f} s (--max-audio-seconds)",
            "audio_too_long",
        )


def decode(audio: Audio, max_seconds: float) -> np.ndarray:
    """The upload as 16 kHz mono float32 samples (mlx-audio's reader);
    :class:`AudioError` when it cannot be decoded, holds nothing, or is too long."""
    import miniaudio
    from mlx_audio.audio_io import read

    if sniff(_head(audio)) == "ogg" and shutil.which("ffmpeg") is None:
        samples = _decode_ogg(audio)
        check_length(samples.size / SAMPLE_RATE, max_seconds)
        if samples.size == 0:
            raise AudioError("the audio file holds no samples", "empty_audio")
        return samples
    try:
        samples, _ = read(_opened(audio), dtype="float32", sample_rate=SAMPLE_RATE, nchannels=1)
    except (miniaudio.DecodeError, RuntimeError, ValueError, OSError) as exc:
        raise AudioError(f"cannot decode the audio: {exc}") from None
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    if samples.size == 0:
        raise AudioError("the audio file holds no samples", "empty_audio")
    check_length(samples.size / SAMPLE_RATE, max_seconds)
    return samples
