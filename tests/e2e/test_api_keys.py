"""Several API keys with per-key limits, over HTTP with the official clients: a key over
its requests or tokens per minute gets a 429 with Retry-After in the API's own error
shape, while another key's requests, sent at the same time, are all served; per-key
counters in /metrics carry a hash of the key, never the key."""

from __future__ import annotations

import concurrent.futures
import hashlib
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

KEYS = """
[keys.slow]
key = "sk-slow"
requests_per_minute = 3

[keys.thrifty]
key = "sk-thrifty"
tokens_per_minute = 20
priority = "low"

[keys.fast]
key = "sk-fast"
"""


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3: Path, tmp_path_factory: Any) -> Server:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(KEYS)
    started: Server = mlxcore_server(
        tiny_qwen3, "--served-model-name", "tiny", "--api-keys-file", str(keys),
        "--api-key", "sk-plain",
    )  # fmt: skip
    return started


def chat(server: Server, key: str) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    return httpx.post(
        f"{server.v1}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def test_a_key_over_its_request_limit_gets_429s_the_other_is_unaffected(server: Server) -> None:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        slow = [pool.submit(chat, server, "sk-slow") for _ in range(10)]
        fast = [pool.submit(chat, server, "sk-fast") for _ in range(10)]
        slow_codes = sorted(f.result().status_code for f in slow)
        fast_codes = [f.result().status_code for f in fast]
    assert slow_codes == [200] * 3 + [429] * 7
    assert fast_codes == [200] * 10
    refused = chat(server, "sk-slow")
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=server.v1, api_key="sk-slow", max_retries=0).models.list()
    assert chat(server, "sk-plain").status_code == 200  # --api-key: no limits
    assert chat(server, "sk-wrong").status_code == 401


def test_a_key_over_its_tokens_gets_429_in_the_anthropic_shape_too(server: Server) -> None:
    assert chat(server, "sk-thrifty").status_code == 200  # ~9 prompt + 4 tokens
    assert chat(server, "sk-thrifty").status_code == 200  # over 20 now
    assert chat(server, "sk-thrifty").status_code == 429
    client = anthropic.Anthropic(base_url=server.base_url, api_key="sk-thrifty", max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
        )
    assert chat(server, "sk-fast").status_code == 200


def test_per_key_counters_name_a_hash_not_the_key(server: Server) -> None:
    chat(server, "sk-fast")
    text = httpx.get(f"{server.base_url}/metrics", headers={"x-api-key": "sk-fast"}).text
    label = hashlib.sha256(b"sk-fast").hexdigest()[:12]
    assert f'mlxcore_api_key_requests_total{{key="{label}"}}' in text
    assert "sk-fast" not in text and "sk-slow" not in text
    limited = hashlib.sha256(b"sk-slow").hexdigest()[:12]
    assert f'mlxcore_api_key_limited_total{{key="{limited}"}}' in text
