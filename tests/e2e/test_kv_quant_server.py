"""`mlxcore serve --kv-cache-dtype int8` with the official client: streamed and whole
answers agree, the next turn reuses the quantized prefix, 48 concurrent requests answer
as they do alone, /metrics shows the quantized bytes per token."""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SYSTEM = "You answer in one short sentence about the given file. " * 20


def test_a_quantized_cache_serves_streams_and_reuses_prefixes(
    mlxcore_server: Any, mlxcore_model_factory: Callable[..., Path]
) -> None:
    model = mlxcore_model_factory("qwen3", head_dim=32)
    server = mlxcore_server(
        model, "--kv-cache-dtype", "int8", "--kv-group-size", "32", "--served-model-name", "m"
    )
    client = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is in a.py?"},
    ]
    whole = client.chat.completions.create(
        model="m", messages=messages, max_tokens=24, temperature=0
    )
    stream = client.chat.completions.create(
        model="m", messages=messages, max_tokens=24, temperature=0, stream=True
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"

    messages += [
        {"role": "assistant", "content": whole.choices[0].message.content or ""},
        {"role": "user", "content": "And b.py?"},
    ]
    turn = client.chat.completions.create(model="m", messages=messages, max_tokens=8)
    assert turn.usage is not None and turn.usage.prompt_tokens_details is not None
    assert (turn.usage.prompt_tokens_details.cached_tokens or 0) > 200

    # many at once: sequences join and leave the quantized batch; answers stay those of alone
    def ask(i: int) -> tuple[str, str | None]:
        reply = client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"Question {i}: name a colour."}],
            max_tokens=4 + i % 13,
            temperature=0,
        )
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(48) as pool:
        together = list(pool.map(ask, range(48)))
    assert all(reason in ("stop", "length") for _, reason in together)
    for i in (0, 7, 25, 47):
        assert ask(i) == together[i]

    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    found = dict(re.findall(r"^(mlxcore_memory_kv_\w*bytes_per_token) ([0-9.e+-]+)$", text, re.M))
    full = float(found["mlxcore_memory_kv_bytes_per_token"])
    quantized = float(found["mlxcore_memory_kv_quantized_bytes_per_token"])
    assert 0 < quantized < full / 2  # float32 model: 8 bits + a float32 scale and bias per 32
