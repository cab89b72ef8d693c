"""OpenAI's ``/v1/audio/transcriptions`` and ``/v1/audio/translations`` (also without
``/v1``): a ``multipart/form-data`` upload, answered in any ``response_format``, or
streamed as ``transcript.text.delta`` events and a ``transcript.text.done``.

Everything is checked before work is queued: the form's fields, the model (one served
for ``stt``), the audio's format and length (from its headers). The engine then decodes
the audio and recognizes it as one job, a 30-second window per piece between its decode
steps (:mod:`.recognizer`); a client that hangs up stops the job at its next window.
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
from litestar import Request, Response, post

from mlxcore.builtin.openai.encode import openai_stream, sse
from mlxcore.engine.engine import EngineOverloaded, EngineUnavailable
from mlxcore.server.errors import APIError, invalid, overloaded
from mlxcore.server.frontend import model_service
from mlxcore.server.openapi import (
    ERRORS_OPTION,
    FORM_OPTION,
    INTEGER,
    NUMBER,
    REPLIES_OPTION,
    STRING,
    array,
    given,
    implies,
    obj,
    reply,
)
from mlxcore.server.service import GenerationService
from mlxcore_audio.audio_input import AudioError, decode, probe
from mlxcore_audio.formats import FORMATS, TEXT_FORMATS, render, usage
from mlxcore_audio.recognizer import (
    SAMPLE_RATE,
    Options,
    SpeechRecognizer,
    Transcript,
    language_code,
    languages,
    recognition_bytes,
    recognize,
)

MAX_FILE_BYTES = 25 * 1024 * 1024
"""Largest audio file (OpenAI's limit: 25 MB)."""
SPOOL_CHUNK = 1 << 20
FORM_SLACK = 64 * 1024
"""Room for the form's other fields beside the file."""
GRANULARITIES = ("segment", "word")
FIELDS = {"file", "model", "language", "prompt", "response_format", "temperature",
          "timestamp_granularities[]", "timestamp_granularities", "stream",
          "chunking_strategy", "include[]", "include"}  # fmt: skip
"""The fields OpenAI's SDK sends; any other is refused."""
MAX_PROMPT_CHARS = 4096
"""Longest prompt (Whisper reads at most 224 of its tokens)."""


@attrs.define
class _Ask:
    """One request's fields, checked."""

    audio: Path
    """The upload, spooled to a file of its own (removed when the request ends)."""
    model: str | None
    response_format: str
    options: Options
    granularities: tuple[str, ...]
    stream: bool


def _form_value(form: Any, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid(f"{name} must be a text field, not a file", name)
    return value


def _temperature(text: str | None) -> tuple[float, ...]:
    """OpenAI's ``temperature``: 0 (the default) lets the recognizer raise it window by
    window when the text fails its checks; another value is used as it is."""
    from mlxcore_audio.recognizer import FALLBACK_TEMPERATURES

    if text is None or text.strip() == "":
        return FALLBACK_TEMPERATURES
    try:
        value = float(text)
    except ValueError:
        raise invalid("temperature must be a number between 0 and 1", "temperature") from None
    if not (math.isfinite(value) and 0 <= value <= 1):
        raise invalid("temperature must be a number between 0 and 1", "temperature")
    return FALLBACK_TEMPERATURES if value == 0 else (value,)


def _flag(text: str | None, name: str) -> bool:
    if text is None:
        return False
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0", ""):
        return False
    raise invalid(f"{name} must be true or false", name)


async def _read_form(request: Request[Any, Any, Any], task: str) -> _Ask:
    """The upload's fields, checked (400 naming the field), and the file's bytes."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(415, "send the audio as multipart/form-data", code="unsupported_media_type")
    try:
        form = await request.form()
    except Exception as exc:  # a body too large, or not a well-formed multipart form
        if getattr(exc, "status_code", None) == 413:
            raise APIError(413, "the audio file is larger than 25 MB", param="file") from None
        raise invalid(f"cannot read the form: {exc}", "file") from None
    unknown = sorted(set(form.keys()) - FIELDS)
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r}", unknown[0])
    if task == "translate" and form.get("language") is not None:
        raise invalid("translations take no language (they are always into English)", "language")
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise invalid("the form needs the audio as its file field", "file")
    fields = _checked(form, task)  # before the upload is written anywhere
    return attrs.evolve(fields, audio=await _spool(upload))


async def _spool(upload: Any) -> Path:
    """The upload written to a temporary file (a queued request holds no audio in
    memory); a 413 past :data:`MAX_FILE_BYTES`."""
    handle, name = tempfile.mkstemp(prefix="mlxcore-audio-")
    path, written = Path(name), 0
    try:
        with os.fdopen(handle, "wb") as out:
            while chunk := await upload.read(SPOOL_CHUNK):
                written += len(chunk)
                if written > MAX_FILE_BYTES:
                    raise APIError(413, "the audio file is larger than 25 MB", param="file")
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _checked(form: Any, task: str) -> _Ask:
    """The form's other fields, checked (the audio not yet spooled: an empty path)."""
    response_format = (_form_value(form, "response_format") or "json").strip()
    if response_format not in FORMATS:
        raise invalid(f"response_format must be one of {', '.join(FORMATS)}", "response_format")
    language = _form_value(form, "language")
    code = None
    if language is not None and language.strip():
        code = language_code(language)
        if code is None:
            raise invalid(f"unknown language {language!r} (an ISO-639-1 code)", "language")
    prompt = _form_value(form, "prompt")
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise invalid(f"prompt is longer than {MAX_PROMPT_CHARS} characters", "prompt")
    granularities = tuple(
        str(g) for name in ("timestamp_granularities[]", "timestamp_granularities")
        for g in form.getall(name, [])
    )  # fmt: skip
    for granularity in granularities:
        if granularity not in GRANULARITIES:
            raise invalid(
                "timestamp_granularities takes segment and word", "timestamp_granularities"
            )
    if granularities and response_format != "verbose_json":
        raise invalid(
            "timestamp_granularities needs response_format verbose_json",
            "timestamp_granularities",
        )
    stream = _flag(_form_value(form, "stream"), "stream")
    if stream and response_format not in ("json", "text"):
        raise invalid("stream works with response_format json or text", "stream")
    if form.getall("include[]", []) or form.getall("include", []):
        raise invalid("include (logprobs) is not supported", "include")
    options = Options(
        task=task,
        language=code,
        prompt=prompt or None,
        temperatures=_temperature(_form_value(form, "temperature")),
        words="word" in granularities,
    )
    model = _form_value(form, "model")
    return _Ask(Path(), model or None, response_format, options, granularities, stream)


def _settings_max_seconds() -> float:
    from mlxcore_audio import settings

    return settings().max_audio_seconds


async def _start(
    request: Request[Any, Any, Any], task: str
) -> tuple[_Ask, GenerationService, Any, asyncio.Queue[str]]:
    """Check the request, queue its job; the request, the model's service, the job and
    where the text so far arrives window by window."""
    ask = await _read_form(request, task)
    try:
        return await _queue(request, ask)
    except BaseException:
        ask.audio.unlink(missing_ok=True)
        raise


async def _queue(
    request: Request[Any, Any, Any], ask: _Ask
) -> tuple[_Ask, GenerationService, Any, asyncio.Queue[str]]:
    svc = await model_service(request, ask.model, task="stt")
    model = svc.runtime.model
    if not isinstance(model, SpeechRecognizer):
        raise invalid("this model does not recognize speech", "model")
    limit = _settings_max_seconds()
    try:
        found = await svc.prepare(probe, ask.audio, limit)
    except AudioError as exc:
        raise _failure(exc) from None
    seconds = found.seconds if found.seconds is not None else limit
    cost = recognition_bytes(model, int(seconds * SAMPLE_RATE) + SAMPLE_RATE)
    loop = asyncio.get_running_loop()
    texts: asyncio.Queue[str] = asyncio.Queue()

    def heard(_segments: list[dict[str, Any]], text: str) -> None:
        loop.call_soon_threadsafe(texts.put_nowait, text)

    audio, options = ask.audio, ask.options
    listener = heard if ask.stream else None
    job = svc.submit_job(
        "transcription",
        lambda: recognize(model, lambda: _decode_spooled(audio, limit), options, listener),
        cost,
    )
    return ask, svc, job, texts


def _decode_spooled(audio: Path, limit: float) -> Any:
    """The spooled upload's samples; the file is removed once read (the job's first
    piece), whatever becomes of the request."""
    try:
        return decode(audio, limit)
    finally:
        audio.unlink(missing_ok=True)


def _failure(exc: AudioError | EngineOverloaded | EngineUnavailable) -> APIError:
    """The answer to a job that ended in ``exc``."""
    if isinstance(exc, AudioError):
        return APIError(400, str(exc), param="file", code=exc.code)
    return overloaded(str(exc))


async def _answer(request: Request[Any, Any, Any], task: str) -> Any:
    ask, _svc, job, texts = await _start(request, task)
    if ask.stream:
        return openai_stream(_events(job, texts, ask.audio))
    try:
        transcript: Transcript = await GenerationService.job_result(request, job)
    except AudioError as exc:
        raise _failure(exc) from None
    finally:
        ask.audio.unlink(missing_ok=True)
    body = render(transcript, ask.response_format, task, ask.granularities)
    if isinstance(body, str):
        return Response(body, media_type=TEXT_FORMATS[ask.response_format])
    return body


async def _events(job: Any, texts: asyncio.Queue[str], audio: Path) -> AsyncIterator[bytes]:
    """``transcript.text.delta`` per window's new text, then ``transcript.text.done``."""
    done = asyncio.wrap_future(job.future)
    sent = ""
    try:
        while True:
            waiter = asyncio.ensure_future(texts.get())
            await asyncio.wait({waiter, done}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                waiter.cancel()
                break
            text = waiter.result()
            if text.startswith(sent) and len(text) > len(sent) and not text.endswith("\ufffd"):
                yield sse({"type": "transcript.text.delta", "delta": text[len(sent) :]})
                sent = text
        try:
            transcript: Transcript = done.result()
        except (AudioError, EngineOverloaded, EngineUnavailable) as exc:
            raise _failure(exc) from None
        while not texts.empty():  # windows heard before the job's end was seen
            texts.get_nowait()
        if transcript.text.startswith(sent) and len(transcript.text) > len(sent):
            yield sse({"type": "transcript.text.delta", "delta": transcript.text[len(sent) :]})
        yield sse(
            {"type": "transcript.text.done", "text": transcript.text, "usage": usage(transcript)}
        )
    finally:
        job.cancel()
        audio.unlink(missing_ok=True)


FORM: dict[str, Any] = {
    "type": "object",
    "required": ["file"],
    "additionalProperties": False,
    "properties": {
        "file": {"type": "string", "contentMediaType": "application/octet-stream",
                 "description": "the audio: wav, mp3, flac (ogg, webm, m4a with ffmpeg)"},
        "model": STRING,
        "prompt": STRING,
        "response_format": {"type": "string", "enum": list(FORMATS)},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
    },
    # a stream is of json or text (response_format json when absent)
    "allOf": [implies(given("stream", {"const": True}),
                      {"properties": {"response_format": {"enum": ["json", "text"]}}})],
}  # fmt: skip
TRANSCRIPTION_FORM: dict[str, Any] = {
    **FORM,
    "properties": {
        **FORM["properties"],
        "language": {
            "type": "string",
            "description": "an ISO-639-1 code or the language's English name",
            "enum": sorted({*languages(), *languages().values()}),
        },
        "timestamp_granularities[]": array({"type": "string", "enum": list(GRANULARITIES)}),
    },
    "allOf": [
        *FORM["allOf"],
        implies(
            given("timestamp_granularities[]", {"minItems": 1}),
            given("response_format", {"const": "verbose_json"}),
        ),
    ],
}
REPLY = obj(
    {"text": STRING},
    {
        "task": STRING,
        "language": STRING,
        "duration": NUMBER,
        "segments": array(obj({"id": INTEGER, "start": NUMBER, "end": NUMBER, "text": STRING})),
        "words": array(obj({"word": STRING, "start": NUMBER, "end": NUMBER})),
        "usage": obj({"type": STRING, "seconds": INTEGER}),
    },
    title="Transcription",
)
_ERRORS = {413: "the audio file is larger than 25 MB"}


@post(
    ["/v1/audio/transcriptions", "/audio/transcriptions"],
    status_code=200,
    request_max_body_size=MAX_FILE_BYTES + FORM_SLACK,
    opt={
        FORM_OPTION: TRANSCRIPTION_FORM,
        REPLIES_OPTION: {200: reply("the transcript", REPLY)},
        ERRORS_OPTION: _ERRORS,
    },
)
async def transcriptions(request: Request[Any, Any, Any]) -> Any:
    """The speech in an audio file as text, in its language."""
    return await _answer(request, "transcribe")


@post(
    ["/v1/audio/translations", "/audio/translations"],
    status_code=200,
    request_max_body_size=MAX_FILE_BYTES + FORM_SLACK,
    opt={
        FORM_OPTION: FORM,
        REPLIES_OPTION: {200: reply("the English text", REPLY)},
        ERRORS_OPTION: _ERRORS,
    },
)
async def translations(request: Request[Any, Any, Any]) -> Any:
    """The speech in an audio file as English text."""
    return await _answer(request, "translate")
