"""``/v1/audio/speech`` in a real server, through OpenAI's SDK: the audio equals mlx-audio's
own in-process synthesis of the same folder, text and seed (wav and pcm sample for
sample, flac losslessly, mp3 and opus as decodable files of the same length), streamed
as it is made; what a model cannot do is a 400 before any work; speech shares the engine
with chats."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import numpy as np
import openai
import pytest

from mlxcore.testing.server import Server
from mlxcore_audio.encoding import PCM_RATE, pcm16, resample
from mlxcore_audio.testing import build_soprano

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TEXT = "Hello there. This is a test of the speech model."
RATE = 32000


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_soprano(tmp_path_factory.mktemp("soprano"))


@pytest.fixture(scope="module")
def server(serve_beside_chat: Any, folder: Path) -> Server:
    return serve_beside_chat("voice", folder, "tts")


def in_process(folder: Path, text: str, seed: int = 0) -> np.ndarray:
    """mlx-audio's own synthesis, seeded as the server's is."""
    from mlx_audio.tts.utils import load_model

    model = load_model(folder)
    mx.random.seed(seed)
    pieces = [np.asarray(r.audio, dtype=np.float32) for r in model.generate(text, verbose=False)]
    return np.concatenate(pieces)


@pytest.fixture(scope="module")
def expected(folder: Path) -> np.ndarray:
    return in_process(folder, TEXT)


def speak(client: openai.OpenAI, **fields: Any) -> bytes:
    fields = {"model": "voice", "voice": "alloy", "input": TEXT, **fields}
    with client.audio.speech.with_streaming_response.create(**fields) as answer:
        return answer.read()


def test_wav_and_pcm_are_the_in_process_samples(
    client: openai.OpenAI, expected: np.ndarray
) -> None:
    wav = speak(client, response_format="wav")
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE"
    assert int.from_bytes(wav[24:28], "little") == RATE
    assert wav[44:] == pcm16(expected)
    pcm = speak(client, response_format="pcm")
    assert pcm == pcm16(resample(expected, RATE, PCM_RATE))


def test_every_file_format_decodes_to_the_speech(
    client: openai.OpenAI, expected: np.ndarray
) -> None:
    import soundfile

    seconds = len(expected) / RATE
    for fmt in ("flac", "mp3", "opus"):
        data = speak(client, response_format=fmt)
        samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
        assert len(samples) / rate == pytest.approx(seconds, abs=0.1), fmt
        if fmt == "flac":
            assert samples.tobytes() == pcm16(expected)
    default = speak(client)  # mp3, OpenAI's default
    assert default[:3] == b"ID3" or default[0] == 0xFF


def test_the_sse_stream_carries_the_audio_and_ends_with_done(
    server: Server, expected: np.ndarray
) -> None:
    body = {"model": "voice", "input": TEXT, "response_format": "pcm", "stream_format": "sse"}
    events = []
    with httpx.stream("POST", f"{server.base_url}/v1/audio/speech", json=body, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    assert [e["type"] for e in events][-1] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert audio == pcm16(resample(expected, RATE, PCM_RATE))


def test_a_seed_picks_the_draws(client: openai.OpenAI, folder: Path) -> None:
    other = in_process(folder, TEXT, seed=7)
    wav = speak(client, response_format="wav", extra_body={"seed": 7})
    assert wav[44:] == pcm16(other)
    assert wav[44:] != speak(client, response_format="wav")[44:]


def test_what_a_model_cannot_do_is_a_400(server: Server) -> None:
    url = f"{server.base_url}/v1/audio/speech"
    base = {"model": "voice", "input": TEXT, "voice": "alloy"}
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"input": ""}, "input"),
        ({"input": "x" * 4097}, "input"),
        ({"speed": 5.0}, "speed"),
        ({"speed": 1.5}, "speed"),  # Soprano speaks at one speed
        ({"instructions": "whisper it"}, "instructions"),
        ({"response_format": "aac"}, "response_format"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "chunks"}, "stream_format"),
        ({"seed": -1}, "seed"),
        ({"pitch": 2}, None),
        ({"model": "chat"}, "model"),
    ]
    for change, param in cases:
        answer = httpx.post(url, json={**base, **change}, timeout=60)
        assert answer.status_code == 400, (change, answer.text)
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        if param is not None:
            assert error["param"] == param, (change, error)
    assert httpx.post(url, json={**base, "model": "nobody"}, timeout=60).status_code == 404
    chat = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "voice", "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert chat.status_code == 400 and "text-to-speech" in chat.json()["error"]["message"]


def test_speech_and_chats_share_the_engine(
    client: openai.OpenAI, expected: np.ndarray, beside_chats: Any
) -> None:
    def say(_: int) -> bytes:
        return speak(client, response_format="wav")[44:]

    assert beside_chats(client, say, 4) == [pcm16(expected)] * 4


def test_voices_are_checked_against_the_ones_a_checkpoint_ships(
    folder: Path, tmp_path: Path
) -> None:
    import shutil

    from mlxcore_audio.loading import load_speech_model

    copy = tmp_path / "voiced"
    shutil.copytree(folder, copy)
    (copy / "voices").mkdir()
    for name in ("af_heart", "bm_george"):  # Kokoro's layout: voices/NAME.safetensors
        mx.save_safetensors(str(copy / "voices" / f"{name}.safetensors"), {"v": mx.zeros(2)})
    loaded = load_speech_model(copy)
    assert loaded is not None
    model = loaded.model
    assert model.voices() == ["af_heart", "bm_george"]
    assert model.refuse("bm_george", 1.0, None) is None
    assert model.refuse(None, 1.0, None) is None  # the model's default voice
    refused = model.refuse("alloy", 1.0, None)
    assert refused is not None and refused.startswith("voice: ") and "af_heart" in refused
    assert model.refuse("af_heart", 2.0, None) == (
        "speed: this model speaks at one speed only (leave speed at 1.0)"
    )
    plain = load_speech_model(folder)
    assert plain is not None and plain.model.voices() is None
    assert plain.model.refuse("any name at all", 1.0, None) is None
