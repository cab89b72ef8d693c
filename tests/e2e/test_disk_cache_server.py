"""`--plugin disk-cache` in a real server: a conversation's next turn after a restart is
served from disk, the response explains its cache use when asked (OpenAI and Anthropic
clients), /metrics counts the disk tier, and a bad option is a 400."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SYSTEM = "You review code. Keep answers short and cite the file. " * 30  # ~400 tokens


def flags(folder: Path) -> tuple[str, ...]:
    return ("--plugin", "disk-cache", "--plugin", "anthropic",
            "--disk-cache-dir", str(folder), "--disk-cache-min-tokens", "64",
            "--served-model-name", "m")  # fmt: skip


def chat(server: Any, messages: list[dict[str, str]], **extra: Any) -> Any:
    client = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0)
    return client.chat.completions.create(
        model="m", messages=messages, max_tokens=8, temperature=0, extra_body=extra or None
    )


def metric(server: Any, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_the_next_turn_after_a_restart_comes_from_disk(
    mlxcore_server: Any, tiny_qwen3: Path, tmp_path: Path
) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Look at a.py"}]
    first = mlxcore_server(tiny_qwen3, *flags(tmp_path))
    reply = chat(first, messages)
    first.stop()
    assert list(tmp_path.glob("*/*.safetensors")), "nothing was written to disk"

    messages += [
        {"role": "assistant", "content": reply.choices[0].message.content or ""},
        {"role": "user", "content": "And b.py?"},
    ]
    second = mlxcore_server(tiny_qwen3, *flags(tmp_path))
    turn = chat(second, messages, explain_cache=True)
    usage = turn.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    explained = (usage.model_extra or {})["mlxcore"]["cache"]
    assert explained["source"] == "disk" and explained["cached_tokens"] == cached
    assert cached >= 0.9 * usage.prompt_tokens
    assert metric(second, "mlxcore_prefix_cache_disk_reads") == 1
    assert metric(second, "mlxcore_prefix_cache_disk_enabled") == 1

    # the Anthropic route reads the same cache and explains it the same way
    client = anthropic.Anthropic(base_url=second.base_url, api_key="none", max_retries=0)
    message = client.messages.create(
        model="m",
        system=SYSTEM,
        messages=[{"role": "user", "content": "Look at a.py"}],
        max_tokens=4,
        extra_body={"explain_cache": True},
    )
    assert message.usage.cache_read_input_tokens
    assert (message.usage.model_extra or {})["mlxcore"]["cache"]["cached_tokens"] == (
        message.usage.cache_read_input_tokens
    )

    bad = httpx.post(
        f"{second.v1}/chat/completions",
        json={"messages": messages, "max_tokens": 2, "explain_cache": "yes"},
        timeout=60,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "explain_cache"
