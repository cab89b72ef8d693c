"""The audio plugin in a real server, through OpenAI's SDK: every response format and the
stream give mlx-audio's own in-process transcript of the same folder and audio; bad
uploads and fields are 4xx in OpenAI's error shape; transcriptions share the engine with
chats under load; a client that hangs up mid-stream costs nothing later."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import numpy as np
import openai
import pytest

from mlxcore.testing.server import Server
from mlxcore_audio.formats import render
from mlxcore_audio.recognizer import Transcript
from mlxcore_audio.testing import build_whisper, speechlike, wav_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SECONDS = 40  # two windows


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_whisper(tmp_path_factory.mktemp("whisper"), seed=1)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audio") / "speech.wav"
    path.write_bytes(wav_bytes(speechlike(SECONDS, seed=5)))
    return path


@pytest.fixture(scope="module")
def server(serve_beside_chat: Any, folder: Path) -> Server:
    return serve_beside_chat("whisper", folder, "stt", "--max-audio-seconds", "600")


def in_process(folder: Path, speech: Path, **options: Any) -> Transcript:
    """mlx-audio's own transcribe, seeded as the server's recognizer is."""
    from mlx_audio.stt import load

    model = load(str(folder))
    mx.random.seed(0)
    out = model.generate(str(speech), **options)
    return Transcript(out.text, out.segments, out.language, SECONDS)


@pytest.fixture(scope="module")
def expected(folder: Path, speech: Path) -> Transcript:
    return in_process(folder, speech, word_timestamps=True)


@pytest.fixture(scope="module")
def expected_plain(folder: Path, speech: Path) -> Transcript:
    return in_process(folder, speech)


def upload(speech: Path) -> tuple[str, bytes]:
    return ("speech.wav", speech.read_bytes())


def test_every_format_gives_the_in_process_transcript(
    client: openai.OpenAI, speech: Path, expected: Transcript, expected_plain: Transcript
) -> None:
    create = client.audio.transcriptions.create
    plain = create(model="whisper", file=upload(speech))
    assert plain.text == expected_plain.text
    assert plain.usage is not None and plain.usage.seconds == SECONDS  # type: ignore[union-attr]
    for fmt in ("text", "srt", "vtt"):
        body = create(model="whisper", file=upload(speech), response_format=fmt)
        assert body == render(expected_plain, fmt, "transcribe", ()), fmt
    verbose = create(
        model="whisper",
        file=upload(speech),
        response_format="verbose_json",
        timestamp_granularities=["segment", "word"],
    )
    want = render(expected, "verbose_json", "transcribe", ("segment", "word"))
    assert isinstance(want, dict)
    assert verbose.text == expected.text
    assert verbose.language == want["language"]
    assert verbose.duration == pytest.approx(SECONDS)
    got_segments = [
        s.model_dump(include={"id", "start", "end", "text"}) for s in verbose.segments or []
    ]
    assert got_segments == [
        {k: s[k] for k in ("id", "start", "end", "text")} for s in want["segments"]
    ]
    assert [w.model_dump() for w in verbose.words or []] == want["words"]
    assert want["words"], "the test model's transcript has words"


def test_the_stream_sends_the_transcript_window_by_window(
    client: openai.OpenAI, speech: Path, expected_plain: Transcript
) -> None:
    events = list(
        client.audio.transcriptions.create(model="whisper", file=upload(speech), stream=True)
    )
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert done.text == expected_plain.text
    assert "".join(d.delta for d in deltas) == done.text  # type: ignore[union-attr]
    assert len(deltas) >= 2  # one per window that added text


@pytest.mark.long  # 16 s: the same server path as transcription, another task (test-long)
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's, for Whisper
def test_translation_gives_the_in_process_translation(
    client: openai.OpenAI, folder: Path, speech: Path
) -> None:
    want = in_process(folder, speech, task="translate")
    got = client.audio.translations.create(model="whisper", file=upload(speech))
    assert got.text == want.text
    french = in_process(folder, speech, task="transcribe", language="fr")
    got = client.audio.transcriptions.create(model="whisper", file=upload(speech), language="fr")
    assert got.text == french.text


def form_post(
    server: Server, path: str, fields: dict[str, Any], data: bytes | None
) -> httpx.Response:
    """A multipart form with ``fields`` and, unless ``None``, ``data`` as its file."""
    parts: list[tuple[str, Any]] = [(name, (None, str(value))) for name, value in fields.items()]
    if data is not None:
        parts.append(("file", ("a.wav", data)))
    return httpx.post(f"{server.base_url}{path}", files=parts, timeout=120)


def test_bad_uploads_and_fields_are_4xx(server: Server, speech: Path) -> None:
    good = speech.read_bytes()
    t = "/v1/audio/transcriptions"
    cases: list[tuple[str, dict[str, Any], bytes | None, int, str | None]] = [
        (t, {"model": "whisper"}, b"", 400, "empty_audio"),
        (t, {"model": "whisper"}, b"%PDF-1.4 not audio at all", 400, "unsupported_audio_format"),
        (t, {"model": "whisper"}, b"RIFF\x10\x00\x00\x00WAVEfmt broken", 400, "invalid_audio"),
        (t, {"model": "whisper"}, wav_bytes(np.zeros(7200 * 100), rate=100), 400, "audio_too_long"),
        (t, {"model": "whisper"}, good[:44] + bytes(26 * 1024 * 1024), 413, None),
        (t, {"model": "whisper"}, None, 400, None),
        (t, {"model": "whisper", "language": "xx"}, good, 400, None),
        (t, {"model": "whisper", "response_format": "docx"}, good, 400, None),
        (t, {"model": "whisper", "temperature": "2"}, good, 400, None),
        (t, {"model": "whisper", "temperature": "nan"}, good, 400, None),
        (t, {"model": "whisper", "timestamp_granularities[]": "word"}, good, 400, None),
        (t, {"model": "whisper", "response_format": "srt", "stream": "true"}, good, 400, None),
        (t, {"model": "whisper", "stream": "perhaps"}, good, 400, None),
        (t, {"model": "whisper", "speed": "2"}, good, 400, None),
        (t, {"model": "chat"}, good, 400, "model_not_supported"),
        (t, {"model": "nobody"}, good, 404, None),
        ("/v1/audio/translations", {"model": "whisper", "language": "de"}, good, 400, None),
    ]
    broken_ogg = b"OggS\x00\x02" + bytes(64)
    cases.append((t, {"model": "whisper"}, broken_ogg, 400, "invalid_audio"))
    if shutil.which("ffmpeg") is None:
        webm = b"\x1a\x45\xdf\xa3" + bytes(64)
        cases.append((t, {"model": "whisper"}, webm, 400, "unsupported_audio_format"))
    for path, fields, data, status, code in cases:
        answer = form_post(server, path, fields, data)
        assert answer.status_code == status, (fields, answer.text)
        if status != 413:
            error = answer.json()["error"]
            assert (error["message"] and error["type"] == "invalid_request_error") or status == 404
            if code is not None:
                assert error["code"] == code, error
    answer = httpx.post(f"{server.base_url}{t}", json={"model": "whisper"}, timeout=30)
    assert answer.status_code == 415
    chat = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "whisper", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert chat.status_code == 400 and "speech-to-text" in chat.json()["error"]["message"]


def test_an_ogg_opus_recording_is_transcribed(server: Server, speech: Path) -> None:
    from mlxcore_audio.encoding import encode

    opus = encode(speechlike(5, seed=2), 16000, "opus")  # what browsers and phones record
    answer = form_post(server, "/v1/audio/transcriptions", {"model": "whisper"}, opus)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["seconds"] == 5


def test_transcriptions_and_chats_share_the_engine(
    client: openai.OpenAI, speech: Path, expected_plain: Transcript, beside_chats: Any
) -> None:
    def transcribe(_: int) -> str:
        return client.audio.transcriptions.create(model="whisper", file=upload(speech)).text

    # the same audio, the same text, whatever ran between its windows
    assert beside_chats(client, transcribe, 4) == [expected_plain.text] * 4


def test_a_client_that_hangs_up_mid_stream_leaves_the_server_serving(
    server: Server, speech: Path, client: openai.OpenAI, expected_plain: Transcript
) -> None:
    long = wav_bytes(speechlike(300, seed=9))
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/audio/transcriptions",
        data={"model": "whisper", "stream": "true"},
        files={"file": ("long.wav", long)},
        timeout=120,
    ) as answer:
        assert answer.status_code == 200
        first = next(answer.iter_lines())
        assert json.loads(first.removeprefix("data: "))["type"].startswith("transcript.text")
    # the abandoned job stops at its next window; the next request is answered as before
    got = client.audio.transcriptions.create(model="whisper", file=upload(speech))
    assert got.text == expected_plain.text
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    assert "transcription" in metrics


def _fuzz_forms(seed: int, count: int, good: bytes) -> list[list[tuple[str, Any]]]:
    """Multipart forms built at random from the fields the route reads, with values in
    and out of range, and files that are audio, cut audio, or noise (seeded)."""
    import random

    rng = random.Random(seed)
    values = ["", "0", "1", "-1", "true", "false", "nan", "1e309", "en", "xx", "json",
              "verbose_json", "srt", "word", "segment", "\x00", "é" * 300, "x" * 5000]  # fmt: skip
    fields = ["model", "language", "prompt", "response_format", "temperature", "stream",
              "timestamp_granularities[]", "include[]", "other"]  # fmt: skip
    files = [good, good[: rng.randrange(1, 200)], bytes(rng.randrange(0, 512)),
             b"RIFF" + bytes(100), b"ID3" + bytes(300), b"fLaC" + bytes(50)]  # fmt: skip
    forms = []
    for _ in range(count):
        form: list[tuple[str, Any]] = [("model", (None, "whisper"))] if rng.random() < 0.8 else []
        for name in rng.sample(fields, rng.randrange(0, 4)):
            form.append((name, (None, rng.choice(values))))
        if rng.random() < 0.9:
            form.append(("file", ("a.wav", rng.choice(files))))
        forms.append(form)
    return forms


def test_generated_bad_forms_are_never_a_5xx(server: Server) -> None:
    good = wav_bytes(speechlike(1, seed=8))
    url = f"{server.base_url}/v1/audio/transcriptions"

    def send(form: list[tuple[str, Any]]) -> int:
        return httpx.post(url, files=form, timeout=300).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(send, _fuzz_forms(11, 120, good)))
    assert all(s < 500 or s == 503 for s in statuses), sorted(set(statuses))
    assert 200 in statuses and 400 in statuses
    import glob
    import tempfile

    # every upload was spooled to a file of its own and removed, answered or refused
    assert glob.glob(f"{tempfile.gettempdir()}/mlxcore-audio-*") == []
    assert httpx.get(f"{server.base_url}/health", timeout=30).status_code == 200


@pytest.mark.long
def test_hundreds_of_connections_are_answered_or_turned_away(server: Server) -> None:
    import asyncio

    good = wav_bytes(speechlike(1, seed=8))

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:

            async def one() -> int:
                form = [("model", (None, "whisper")), ("file", ("a.wav", good))]
                answer = await http.post(f"{server.base_url}/v1/audio/transcriptions", files=form)
                return answer.status_code

            return list(await asyncio.gather(*(one() for _ in range(300))))

    statuses = asyncio.run(burst())
    assert set(statuses) <= {200, 503}, sorted(set(statuses))
    assert statuses.count(200) >= 1
