"""The step budget (issue 75): a client cannot make one engine step long.

The heavy request is the shape a stock Schemathesis coverage phase sends (``n`` 16, a
budget that fills the context, 20 logprobs with echo and 20 prompt logprobs, a stop list)
on the default model with default flags, beside a greedy stream: the stream keeps its
pace while the heavy prompt prefills, no step runs for more than a few seconds, the
engine never restarts, and the 16 choices compute their shared prompt once.
"""

from __future__ import annotations

import collections
import itertools
import json
import threading
import time
from typing import Any

import httpx
import pytest

from mlxcore.models.default import ensure_default_model
from mlxcore.testing.server import Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.long]  # 90 s on 2 cores

PROMPT_TOKENS = 2500
STREAM_TOKENS = 200


@pytest.fixture(scope="module")
def smollm(mlxcore_server: Any) -> Server:
    server: Server = mlxcore_server(ensure_default_model(), "--served-model-name", "smol")
    return server


def engine_figure(server: Server, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(f"mlxcore_{name} ") or line.startswith(f"mlxcore_{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no mlxcore_{name} in /metrics")


def test_a_coverage_phase_request_beside_a_stream_keeps_every_step_short(smollm: Server) -> None:
    empty = {"model": "smol", "prompt": ""}
    sized = httpx.post(f"{smollm.base_url}/tokenize", json=empty, timeout=30)
    context = int(sized.json()["max_model_len"])
    before = engine_figure(smollm, "prompt_tokens_processed")
    restarts = engine_figure(smollm, "engine_restarts")
    stamps: list[float] = []

    def stream() -> None:
        body = {
            "model": "smol", "stream": True, "max_tokens": STREAM_TOKENS, "temperature": 0,
            "ignore_eos": True, "messages": [{"role": "user", "content": "Tell me about rivers."}],
        }  # fmt: skip
        with httpx.stream("POST", f"{smollm.v1}/chat/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and '"content"' in line:
                    stamps.append(time.monotonic())

    streamer = threading.Thread(target=stream)
    streamer.start()
    deadline = time.monotonic() + 120
    while len(stamps) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(stamps) >= 10, "the greedy stream did not start"
    heavy = {
        "model": "smol",
        "prompt": [(i * 7919) % 30000 + 100 for i in range(PROMPT_TOKENS)],
        "n": 16,
        "max_tokens": context - PROMPT_TOKENS,
        "min_tokens": context - PROMPT_TOKENS,
        "echo": True,
        "logprobs": 20,
        "prompt_logprobs": 20,
        "temperature": 1.0,
        "stop": [f"stop-{i}" for i in range(4)],
        "stream": True,
    }
    chunks: collections.Counter[int] = collections.Counter()  # text chunks per choice
    joined: list[float] = []
    with httpx.stream("POST", f"{smollm.v1}/completions", json=heavy, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():  # the echoed prompt first, then the 16 choices' tokens
            if line.startswith("data:") and '"text"' in line and "[DONE]" not in line:
                chunk = json.loads(line[5:])
                chunks.update(c["index"] for c in chunk["choices"] if c.get("text"))
                if not joined and chunks:
                    joined.append(time.monotonic())  # the scored prompt's echo: prefill done
            if sum(n >= 2 for n in chunks.values()) == 16 and not streamer.is_alive():
                break  # all 16 decode (echo, then tokens) and the stream is done: hang up
    streamer.join()
    assert len(stamps) == STREAM_TOKENS and joined
    prefilling = sorted(b - a for a, b in itertools.pairwise(stamps) if b < joined[0])
    assert len(prefilling) > 20, "the stream ended before the heavy prompt's prefill did"
    # Beside the scored prefill the stream keeps its pace (chunks sized in time; before:
    # 128-256-token chunks, 1.9-2 s gaps); the 16 rows' joins take 1.5-1.7 s steps on 2
    # cores, and so do the steps that decode them (20 logprobs a row): bounded, not yet
    # under the issue's 1 s (docs/benchmarks.md, "The step budget").
    assert prefilling[len(prefilling) // 2] < 0.5, prefilling[-5:]
    assert prefilling[-1] < 3.0, f"the stream waited {prefilling[-1]:.2f} s beside the prefill"
    assert engine_figure(smollm, "engine_restarts") == restarts
    assert engine_figure(smollm, "engine_hangs") == 0
    assert 0 < engine_figure(smollm, "engine_step_seconds_max") < 6.0
    assert engine_figure(smollm, "step_time_target_seconds") == 1.0
    processed = engine_figure(smollm, "prompt_tokens_processed") - before
    assert PROMPT_TOKENS <= processed < 1.5 * PROMPT_TOKENS + 100, processed  # one prefill
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    if max(gaps) >= 1.0:  # the decode steps beside 16 scored rows: not bounded yet
        pytest.xfail(f"beside the 16 decoding rows the stream waited {max(gaps):.2f} s")
