"""The recognizer window by window against mlx-audio's own ``generate`` on the same
folder and audio (identical segments and text, timestamps, words, language and task,
prompt), the response formats, and the checks on uploaded audio."""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Generator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from mlxcore_audio.audio_input import AudioError, decode, probe, sniff
from mlxcore_audio.formats import clock, render, srt, vtt
from mlxcore_audio.recognizer import (
    Options,
    SpeechRecognizer,
    Transcript,
    language_code,
    recognition_bytes,
    recognize,
)
from mlxcore_audio.testing import build_whisper, speechlike, wav_bytes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def whisper(folder: Path) -> Any:
    from mlx_audio.stt import load

    return load(str(folder))


def run(pieces: Generator[None, None, Transcript]) -> tuple[Transcript, int]:
    """Run a recognition to its end as the engine does; its result and its pieces."""
    count = 0
    while True:
        try:
            next(pieces)
            count += 1
        except StopIteration as done:
            return done.value, count


CASES = [
    pytest.param(7, {}, id="default"),
    pytest.param(45, {}, id="two-windows"),
    pytest.param(12, {"word_timestamps": True}, id="words"),
    pytest.param(8, {"language": "fr", "task": "translate"}, id="translate-from-french"),
    pytest.param(8, {"initial_prompt": "Paris, Lyon and Marseille."}, id="prompt"),
    pytest.param(8, {"return_timestamps": False}, id="no-timestamps"),
    pytest.param(8, {"temperature": 0.6}, id="one-temperature"),
]


@pytest.mark.parametrize(("seconds", "options"), CASES)
def test_the_recognizer_gives_mlx_audios_transcript(
    whisper: Any, tmp_path: Path, seconds: int, options: dict[str, Any]
) -> None:
    path = tmp_path / "speech.wav"
    path.write_bytes(wav_bytes(speechlike(seconds, seed=seconds)))
    from mlx_audio.stt.utils import load_audio

    temperature = options.pop("temperature", (0.0, 0.2, 0.4, 0.6, 0.8, 1.0))
    mx.random.seed(0)
    expected = whisper.generate(str(path), temperature=temperature, **options)

    mx.random.seed(12345)  # the recognizer draws from its own key, not the global one
    ours = Options(
        task=options.get("task", "transcribe"),
        language=options.get("language"),
        prompt=options.get("initial_prompt"),
        temperatures=temperature if isinstance(temperature, tuple) else (temperature,),
        timestamps=options.get("return_timestamps", True),
        words=options.get("word_timestamps", False),
    )
    heard: list[str] = []
    got, pieces = run(
        recognize(
            SpeechRecognizer(whisper),
            np.array(load_audio(str(path))),
            ours,
            lambda _segments, text: heard.append(text),
        )
    )
    assert got.text == expected.text
    assert got.language == expected.language
    assert json.dumps(got.segments) == json.dumps(expected.segments)  # NaN-safe, exact
    assert got.duration == pytest.approx(seconds, abs=0.01)
    assert pieces >= 1 + (seconds + 29) // 30  # the language, then at least a piece a window
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(heard))
    if heard:
        assert got.text.startswith(heard[-1])


def test_a_recognition_is_the_same_whatever_the_engine_draws_meanwhile(whisper: Any) -> None:
    audio = speechlike(6, seed=3)
    model = SpeechRecognizer(whisper)
    first, _ = run(recognize(model, audio, Options(language="en")))
    pieces = recognize(model, audio, Options(language="en"))
    next(pieces)
    mx.random.seed(777)  # other work between two windows
    mx.random.uniform(shape=(10,))
    second, _ = run(pieces)
    assert json.dumps(second.segments) == json.dumps(first.segments)
    outside = mx.random.uniform(shape=(3,))
    mx.random.seed(777)
    mx.random.uniform(shape=(10,))
    assert mx.array_equal(outside, mx.random.uniform(shape=(3,)))  # its state was left alone


def test_the_memory_estimate_covers_the_audio_and_grows_with_it(whisper: Any) -> None:
    model = SpeechRecognizer(whisper)
    minute, hour = recognition_bytes(model, 16000 * 60), recognition_bytes(model, 16000 * 3600)
    assert minute > 16000 * 60 * 4
    assert hour - minute >= 16000 * 3540 * (4 + 80 * 4 / 160)


def test_languages_by_code_or_english_name() -> None:
    assert language_code("fr") == "fr"
    assert language_code("French") == "fr"
    assert language_code(" english ") == "en"
    assert language_code("klingon") is None


def transcript() -> Transcript:
    segments = [
        {"id": 0, "seek": 0, "start": 0.0, "end": 1.5, "text": " Hello there.", "tokens": [1],
         "temperature": 0.0, "avg_logprob": float("nan"), "compression_ratio": 1.0,
         "no_speech_prob": 0.1, "words": [{"word": " Hello", "start": 0.0, "end": 0.5},
                                         {"word": " there.", "start": 0.6, "end": 1.5}]},
        {"id": 1, "seek": 0, "start": 1.5, "end": 1.5, "text": "", "tokens": [],
         "temperature": 0.0, "avg_logprob": -0.2, "compression_ratio": 1.0,
         "no_speech_prob": 0.1, "words": []},
        {"id": 2, "seek": 0, "start": 3661.25, "end": 3662.0, "text": " Bye.", "tokens": [2],
         "temperature": 0.2, "avg_logprob": -0.3, "compression_ratio": 1.1,
         "no_speech_prob": 0.2, "words": [{"word": " Bye.", "start": 3661.25, "end": 3662.0}]},
    ]  # fmt: skip
    return Transcript(" Hello there. Bye.", segments, "en", 3662.2)


def test_subtitles_number_their_cues_and_skip_empty_segments() -> None:
    assert clock(3661.25, ",") == "01:01:01,250"
    assert srt(transcript()) == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n2\n01:01:01,250 --> 01:01:02,000\nBye.\n"
    )
    assert vtt(transcript()) == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
        "01:01:01.250 --> 01:01:02.000\nBye.\n"
    )


def test_verbose_json_has_what_was_asked_for() -> None:
    full = render(transcript(), "verbose_json", "transcribe", ("segment", "word"))
    assert isinstance(full, dict)
    assert full["language"] == "english" and full["duration"] == 3662.2
    assert [s["id"] for s in full["segments"]] == [0, 2]
    assert full["segments"][0]["avg_logprob"] is None  # NaN is no JSON number
    assert [w["word"] for w in full["words"]] == ["Hello", "there.", "Bye."]
    assert full["usage"] == {"type": "duration", "seconds": 3663}
    words = render(transcript(), "verbose_json", "transcribe", ("word",))
    assert isinstance(words, dict) and "segments" not in words and len(words["words"]) == 3
    plain = render(transcript(), "verbose_json", "translate", ())
    assert isinstance(plain, dict) and "words" not in plain and plain["task"] == "translate"
    assert render(transcript(), "text", "transcribe", ()) == " Hello there. Bye.\n"
    assert render(transcript(), "json", "transcribe", ())["text"] == " Hello there. Bye."  # type: ignore[index]


def wav_header_claiming(seconds: float, rate: int = 16000) -> bytes:
    """A WAV file whose header says it holds ``seconds`` of 16-bit mono audio, followed
    by one second of it (a file cut short, or one that lies)."""
    data_bytes = int(seconds * rate) * 2
    header = b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    header += b"data" + struct.pack("<I", data_bytes)
    return header + b"\x00\x01" * rate


def test_uploads_are_checked_from_their_headers() -> None:
    good = wav_bytes(speechlike(2))
    assert probe(good, 60).seconds == pytest.approx(2.0)
    assert sniff(good) == "wav"
    assert sniff(b"fLaC\x00\x00\x00\x22") == "flac"
    assert sniff(b"ID3\x04\x00") == "mp3" and sniff(b"\xff\xfb\x90\x00") == "mp3"
    assert sniff(b"\xff\xf1\x50\x80") is None  # ADTS AAC, not MPEG audio
    cases = {
        b"": "empty_audio",
        b"just some text, not audio": "unsupported_audio_format",
        # two hours at 100 samples a second: 1.4 MB, but 460 MB once decoded at 16 kHz
        wav_bytes(np.zeros(7200 * 100), rate=100): "audio_too_long",
        b"RIFF\x10\x00\x00\x00WAVEfmt garbage": "invalid_audio",
    }
    for data, code in cases.items():
        with pytest.raises(AudioError) as caught:
            probe(data, 3600)
        assert caught.value.code == code, data[:20]
    # a header that claims two hours over one second of samples: what is there counts
    assert probe(wav_header_claiming(7200), 3600).seconds == pytest.approx(1.0)


def test_decoding_gives_mlx_audios_samples_and_checks_the_length(tmp_path: Path) -> None:
    from mlx_audio.stt.utils import load_audio

    stereo = np.stack([speechlike(2, 1, 44100), speechlike(2, 2, 44100)], axis=1)
    data = wav_bytes(stereo, rate=44100, channels=2)
    path = tmp_path / "stereo.wav"
    path.write_bytes(data)
    assert probe(path, 60) == probe(data, 60)  # a spooled upload reads as its bytes do
    assert np.array_equal(decode(path, 60), decode(data, 60))
    samples = decode(data, 60)
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert np.array_equal(samples, np.array(load_audio(str(path))))
    with pytest.raises(AudioError, match="limit of 1 s"):
        decode(data, 1.0)


def test_ogg_opus_decodes_in_process() -> None:
    from mlxcore_audio.encoding import encode

    opus = encode(speechlike(3, seed=4), 16000, "opus")
    assert sniff(opus) == "ogg"
    assert probe(opus, 60).seconds == pytest.approx(3.0, abs=0.05)
    samples = decode(opus, 60)
    assert samples.dtype == np.float32 and samples.size == pytest.approx(48000, abs=800)
    with pytest.raises(AudioError) as caught:
        probe(b"OggS" + bytes(40), 60)
    assert caught.value.code == "invalid_audio"
