"""``mlxcore serve --plugin expert-stream --expert-memory SIZE`` as a user runs it: chat
answers (streamed and not) equal to a fully loaded server's, the cache's figures on
/health and /metrics, and a size too small refused at start with the size that works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mlxcore_expert_stream.testing import routed_bytes

QUESTIONS = ["Name three colours.", "What is 2 + 2?", "Write a haiku about disks."]


@pytest.fixture(scope="module")
def moe(mlxcore_model_factory: Any) -> Path:
    return Path(mlxcore_model_factory("qwen3_moe", num_experts=16))


def _answers(server: Any) -> list[tuple[str, str]]:
    client = openai.OpenAI(base_url=server.v1, api_key="x")
    name = client.models.list().data[0].id
    out = []
    for question in QUESTIONS:
        body: dict[str, Any] = {
            "model": name,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 24,
            "temperature": 0,
        }
        whole = client.chat.completions.create(**body).choices[0].message.content or ""
        stream = client.chat.completions.create(**body, stream=True)
        pieces = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        out.append((whole, pieces))
    return out


def test_a_streamed_server_answers_as_the_fully_loaded_one(moe: Path, mlxcore_server: Any) -> None:
    expected = _answers(mlxcore_server(moe))
    size = f"{int(0.35 * routed_bytes(moe)) // 1024}KB"
    streamed = mlxcore_server(moe, "--plugin", "expert-stream", "--expert-memory", size)
    assert _answers(streamed) == expected
    assert all(whole == pieces for whole, pieces in expected)
    cache = streamed.health()["expert_cache"]
    assert isinstance(cache, dict) and cache["misses"] > 0 and cache["read_bytes"] > 0
    assert 0 < cache["bytes"] <= cache["capacity_bytes"] == int(size[:-2]) * 1000
    metrics = httpx.get(streamed.v1.removesuffix("/v1") + "/metrics", timeout=10).text
    assert "mlxcore_expert_cache_hits" in metrics


def test_a_size_below_one_tokens_experts_is_refused_at_start(moe: Path) -> None:
    cmd = [sys.executable, "-m", "mlxcore", "serve", str(moe), "--port", "1"]
    cmd += ["--plugin", "expert-stream", "--expert-memory", "1KB"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "the smallest that works is" in out.stderr, out.stderr[-2000:]
