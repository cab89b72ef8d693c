"""A transcript in each of OpenAI's ``response_format`` values: ``json``, ``text``,
``srt``, ``vtt`` and ``verbose_json`` (segments and, when asked, words with their times).

Segments that carry no text (the recognizer empties instantaneous or blank ones) are
left out of every format.
"""

from __future__ import annotations

import math
from typing import Any

from mlxcore_audio.recognizer import Transcript, languages

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
"""The values ``response_format`` takes (OpenAI's)."""
TEXT_FORMATS = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}
"""The formats answered as text, and their media types."""
SEGMENT_FIELDS = ("id", "seek", "start", "end", "text", "tokens", "temperature",
                  "avg_logprob", "compression_ratio", "no_speech_prob")  # fmt: skip


def usage(transcript: Transcript) -> dict[str, Any]:
    """OpenAI's usage for audio billed by length: the whole seconds heard."""
    return {"type": "duration", "seconds": math.ceil(transcript.duration)}


def spoken(transcript: Transcript) -> list[dict[str, Any]]:
    """The segments that carry text."""
    return [s for s in transcript.segments if s["text"].strip()]


def clock(seconds: float, separator: str) -> str:
    """``HH:MM:SS<separator>mmm`` (``,`` for SubRip, ``.`` for WebVTT)."""
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{whole:02d}{separator}{millis:03d}"


def srt(transcript: Transcript) -> str:
    """SubRip subtitles: numbered cues from 1."""
    cues = []
    for number, segment in enumerate(spoken(transcript), start=1):
        span = f"{clock(segment['start'], ',')} --> {clock(segment['end'], ',')}"
        cues.append(f"{number}\n{span}\n{segment['text'].strip()}\n")
    return "\n".join(cues)


def vtt(transcript: Transcript) -> str:
    """WebVTT subtitles."""
    cues = ["WEBVTT\n"]
    for segment in spoken(transcript):
        span = f"{clock(segment['start'], '.')} --> {clock(segment['end'], '.')}"
        cues.append(f"{span}\n{segment['text'].strip()}\n")
    return "\n".join(cues)


def verbose(transcript: Transcript, task: str, granularities: tuple[str, ...]) -> dict[str, Any]:
    """``verbose_json``: the task, the language's English name, the length, the text, and
    the segments (unless only words were asked for) and words (when asked for)."""
    body: dict[str, Any] = {
        "task": task,
        "language": languages().get(transcript.language, transcript.language),
        "duration": transcript.duration,
        "text": transcript.text,
    }
    kept = spoken(transcript)
    if not granularities or "segment" in granularities:
        body["segments"] = [_segment(s) for s in kept]
    if "word" in granularities:
        body["words"] = [
            {"word": w["word"].strip(), "start": w["start"], "end": w["end"]}
            for s in kept
            for w in s.get("words") or ()
        ]
    body["usage"] = usage(transcript)
    return body


def _segment(segment: dict[str, Any]) -> dict[str, Any]:
    out = {name: segment[name] for name in SEGMENT_FIELDS}
    for name in ("avg_logprob", "compression_ratio", "no_speech_prob", "temperature"):
        value = out[name]
        out[name] = float(value) if value is not None and math.isfinite(value) else None
    return out


def render(
    transcript: Transcript, response_format: str, task: str, granularities: tuple[str, ...]
) -> dict[str, Any] | str:
    """The body for ``response_format``: a dict for the JSON formats, text otherwise."""
    if response_format == "json":
        return {"text": transcript.text, "usage": usage(transcript)}
    if response_format == "verbose_json":
        return verbose(transcript, task, granularities)
    if response_format == "srt":
        return srt(transcript)
    if response_format == "vtt":
        return vtt(transcript)
    return transcript.text + "\n"
