"""Transcription speed: the real-time factor (seconds of work per second of audio) of a
real server's ``/v1/audio/transcriptions`` against mlx-audio's own ``generate`` in
process on the same folder and audio, rounds alternating.

    .venv/bin/python scripts/transcription_bench.py [--model PATH] [--seconds 60] [--rounds 3]
    .venv/bin/python scripts/transcription_bench.py --speech [--rounds 3]

``--speech``: the same for ``/v1/audio/speech`` (wav) against the model's own
``generate``: a Soprano with a small language model and Soprano's own Vocos decoder.

Without ``--model``: a Whisper of whisper-tiny's shape (mlx-audio's float16, as it loads
every Whisper) with seeded weights. Random weights never pass Whisper's quality checks,
so every window is decoded at all six fallback temperatures, to the window's token limit
(224): the absolute factor is far worse than a trained model's on real speech; the ratio
is what compares the server with the library. Prints JSON; docs/plugins/audio.md records
it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import mlx.core as mx

from mlxcore.testing.server import ServerPool
from mlxcore_audio.testing import (
    WHISPER_TINY,
    build_soprano,
    build_whisper,
    speechlike,
    wav_bytes,
)

SPEECH_TEXT = "The quick brown fox jumps over the lazy dog. It was a bright cold day in April."


def speech_bench(folder: Path, pool: ServerPool, rounds: int) -> dict[str, object]:
    """Seconds of work per second of speech, server (wav) and in process."""
    import numpy as np
    from mlx_audio.tts.utils import load_model

    model_path = build_soprano(folder / "soprano")
    server = pool(model_path)
    model = load_model(model_path)
    served, local = [], []
    seconds = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        answer = httpx.post(
            f"{server.base_url}/v1/audio/speech",
            json={"input": SPEECH_TEXT, "response_format": "wav"},
            timeout=3600,
        )
        answer.raise_for_status()
        took = time.perf_counter() - started
        seconds = (len(answer.content) - 44) / 2 / model.sample_rate
        served.append(took / seconds)
        mx.random.seed(0)
        started = time.perf_counter()
        audio = np.concatenate([np.asarray(r.audio) for r in model.generate(SPEECH_TEXT)])
        local.append((time.perf_counter() - started) / (len(audio) / model.sample_rate))
    ratio = statistics.median(p / s for s, p in zip(served, local, strict=True))
    return {
        "speech_seconds": round(seconds, 2),
        "server_rtf": round(statistics.median(served), 4),
        "in_process_rtf": round(statistics.median(local), 4),
        "speed_ratio": round(ratio, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speech", action="store_true")
    args = parser.parse_args(argv)
    from mlxcore.blas import reexec_with_openblas

    reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])
    from mlx_audio.stt import load

    folder = Path(tempfile.mkdtemp(prefix="transcription-bench-"))
    if args.speech:
        pool = ServerPool(folder)
        try:
            print(json.dumps(speech_bench(folder, pool, args.rounds), indent=2))
        finally:
            pool.close()
        return 0
    model_path = args.model or str(build_whisper(folder / "whisper", WHISPER_TINY))
    audio = folder / "speech.wav"
    audio.write_bytes(wav_bytes(speechlike(args.seconds, seed=1)))
    pool = ServerPool(folder)
    report: dict[str, object] = {"audio_seconds": args.seconds, "model": model_path}
    try:
        server = pool(model_path)
        model = load(model_path)
        served, local = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            answer = httpx.post(
                f"{server.base_url}/v1/audio/transcriptions",
                files={"file": ("speech.wav", audio.read_bytes())},
                timeout=3600,
            )
            answer.raise_for_status()
            served.append((time.perf_counter() - started) / args.seconds)
            mx.random.seed(0)
            started = time.perf_counter()
            expected = model.generate(str(audio))
            local.append((time.perf_counter() - started) / args.seconds)
            report["same_text"] = answer.json()["text"] == expected.text
        report["server_rtf"] = round(statistics.median(served), 3)
        report["in_process_rtf"] = round(statistics.median(local), 3)
        report["speed_ratio"] = round(
            statistics.median(p / s for s, p in zip(served, local, strict=True)), 3
        )
    finally:
        pool.close()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
