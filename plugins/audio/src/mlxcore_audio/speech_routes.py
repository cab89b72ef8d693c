"""OpenAI's ``/v1/audio/speech`` (also ``/audio/speech``): text spoken by a TTS model, as
one audio file in ``response_format``, sent as it is made where the format allows
(``pcm`` and ``wav``: each segment's samples as soon as it is spoken), or as
``speech.audio.delta`` / ``speech.audio.done`` server-sent events
(``stream_format = "sse"``).

Everything is checked before work is queued (the fields, the model, what the model can
do with a voice, a speed, instructions); the engine then speaks the text as one job, a
segment per piece between its decode steps (:mod:`.synthesizer`). A client that hangs up
stops the job at its next segment.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, post
from litestar.response import Stream

from mlxcore.builtin.openai.encode import openai_stream, sse
from mlxcore.engine.engine import EngineOverloaded, EngineUnavailable
from mlxcore.server.errors import invalid, overloaded
from mlxcore.server.frontend import decode_body, model_service
from mlxcore.server.openapi import BODY_OPTION, REPLIES_OPTION, reply
from mlxcore.server.service import GenerationService
from mlxcore_audio.encoding import (
    MEDIA_TYPES,
    PCM_RATE,
    encode,
    pcm16,
    resample,
    wav_stream_header,
)
from mlxcore_audio.synthesizer import (
    MAX_INPUT_CHARS,
    Speech,
    SpeechSynthesizer,
    synthesis_bytes,
    synthesize,
)

_Input = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_INPUT_CHARS)]


class SpeechRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input: _Input
    model: str | None = None
    voice: str | None = None
    response_format: Literal["mp3", "opus", "flac", "wav", "pcm"] = "mp3"
    """OpenAI's formats but ``aac``, which has no encoder here."""
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] = 1.0
    instructions: Annotated[str, msgspec.Meta(max_length=MAX_INPUT_CHARS)] | None = None
    stream_format: Literal["audio", "sse"] = "audio"
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    """Not OpenAI's: where the synthesis's random draws start (default 0, so the same
    request gives the same audio)."""


async def _start(
    request: Request[Any, Any, Any],
) -> tuple[SpeechRequest, SpeechSynthesizer, Any, asyncio.Queue[Any]]:
    """Check the request, queue its job; the request, the model, the job and where the
    samples of each segment arrive."""
    body = await decode_body(request, SpeechRequest)
    svc = await model_service(request, body.model, task="tts")
    model = svc.runtime.model
    if not isinstance(model, SpeechSynthesizer):
        raise invalid("this model does not speak", "model")
    refused = model.refuse(body.voice, body.speed, body.instructions)
    if refused is not None:
        field, reason = refused.split(": ", 1)
        raise invalid(reason, field)
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[Any] = asyncio.Queue()

    def heard(samples: Any) -> None:
        loop.call_soon_threadsafe(chunks.put_nowait, samples)

    streams = body.stream_format == "sse" or body.response_format in ("pcm", "wav")
    job = svc.submit_job(
        "speech",
        lambda: synthesize(
            model,
            body.input,
            voice=body.voice,
            speed=body.speed,
            instructions=body.instructions,
            seed=body.seed or 0,
            on_audio=heard if streams else None,
        ),
        synthesis_bytes(body.input),
    )
    return body, model, job, chunks


async def _segments(job: Any, chunks: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """Each segment's samples as the job makes them; ends with the job (its error
    raised)."""
    done = asyncio.wrap_future(job.future)
    try:
        while True:
            waiter = asyncio.ensure_future(chunks.get())
            await asyncio.wait({waiter, done}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                yield waiter.result()
                continue
            waiter.cancel()
            while not chunks.empty():
                yield chunks.get_nowait()
            try:
                done.result()
            except (EngineOverloaded, EngineUnavailable) as exc:
                raise overloaded(str(exc)) from None
            return
    finally:
        job.cancel()


async def _raw(
    body: SpeechRequest, rate: int, job: Any, chunks: asyncio.Queue[Any]
) -> AsyncIterator[bytes]:
    """``pcm`` or ``wav`` bytes, a segment at a time."""
    if body.response_format == "wav":
        yield wav_stream_header(rate)
    async for samples in _segments(job, chunks):
        if body.response_format == "pcm":
            yield pcm16(resample(samples, rate, PCM_RATE))
        else:
            yield pcm16(samples)


async def _events(
    body: SpeechRequest, rate: int, job: Any, chunks: asyncio.Queue[Any]
) -> AsyncIterator[bytes]:
    """``speech.audio.delta`` per segment (base64 audio in ``response_format``; ``pcm``
    and ``wav`` chunks as raw samples, others each a file of their own), then
    ``speech.audio.done``."""
    total = 0
    async for samples in _segments(job, chunks):
        total += len(samples)
        if body.response_format == "pcm":
            data = pcm16(resample(samples, rate, PCM_RATE))
        else:
            data = encode(samples, rate, body.response_format)
        yield sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    yield sse({"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": 0,
                                                      "total_tokens": 0}})  # fmt: skip


SPEECH_REPLY = {"type": "string", "format": "binary"}


@post(
    ["/v1/audio/speech", "/audio/speech"],
    status_code=200,
    opt={
        BODY_OPTION: SpeechRequest,
        REPLIES_OPTION: {
            200: reply("the audio", SPEECH_REPLY, media_type="application/octet-stream")
        },
    },
)
async def speech(request: Request[Any, Any, Any]) -> Any:
    """Text spoken aloud by a text-to-speech model."""
    body, model, job, chunks = await _start(request)
    rate = model.sample_rate
    if body.stream_format == "sse":
        return openai_stream(_events(body, rate, job, chunks))
    media_type = MEDIA_TYPES[body.response_format]
    if body.response_format in ("pcm", "wav"):
        return Stream(_raw(body, rate, job, chunks), media_type=media_type)
    spoken: Speech = await GenerationService.job_result(request, job)
    data = await asyncio.to_thread(encode, spoken.samples, spoken.sample_rate, body.response_format)
    return Response(data, media_type=media_type)
