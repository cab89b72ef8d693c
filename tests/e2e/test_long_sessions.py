"""An agent session past the old 32,768-token default through a real server started with
default flags (the shared ``qwen_server``): every main turn is served from the cache of
the one before, side and compacted requests from the system prompt and tools, through
Chat Completions and the Messages API. (Sessions of 118-256K tokens: scripts/long_sessions.py
and docs/benchmarks.md, "Long agent sessions".)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from transformers import AutoTokenizer

from mlxcore.bench.agent_shapes import (
    AgentRequest,
    SessionShape,
    anthropic_body,
    openai_messages,
    session_requests,
)
from mlxcore.testing.server import Server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

API_KEY = "test-key"  # as qwen_server in conftest.py
MODEL = "tiny-qwen3"
SHAPE = SessionShape(turns=5, result_tokens=4_000)
"""~17.5K tokens of system prompt and tools, then 4K-token tool results: ~38K tokens."""


def requests(tiny_qwen3: Path, label: str) -> list[AgentRequest]:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    shape = SessionShape(turns=SHAPE.turns, result_tokens=SHAPE.result_tokens, label=label)
    return list(session_requests(shape, count))


def send_openai(server: Server, request: AgentRequest) -> tuple[int, int]:
    client = openai.OpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=MODEL, messages=openai_messages(request),  # type: ignore[arg-type]
        tools=request.tools, max_tokens=2, temperature=0,  # type: ignore[arg-type]
    )  # fmt: skip
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


def send_anthropic(server: Server, request: AgentRequest) -> tuple[int, int]:
    client = anthropic.Anthropic(
        base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=300
    )
    body: Any = anthropic_body(request, MODEL, 2)
    reply = client.messages.create(**body, extra_body={"temperature": 0})
    cached = reply.usage.cache_read_input_tokens or 0
    return reply.usage.input_tokens + cached, cached


@pytest.mark.parametrize(
    "front",
    # the same session through the Messages API: a variant (`make test-long`), the
    # OpenAI front end's run is the main case (50 s each on CI's two cores)
    ["openai", pytest.param("anthropic", marks=pytest.mark.long)],
)
def test_a_session_past_32k_tokens_keeps_its_cache_with_default_flags(
    front: str, qwen_server: Server, tiny_qwen3: Path
) -> None:
    send = send_openai if front == "openai" else send_anthropic
    previous = system_and_tools = 0
    rows = []
    for request in requests(tiny_qwen3, f"{front} session"):
        prompt, cached = send(qwen_server, request)
        rows.append((request.kind, request.turn, prompt, cached))
        if request.kind == "main" and request.turn == 0:
            system_and_tools = prompt - 30  # all but the first user message
        elif request.kind == "main":
            assert cached >= 0.95 * previous, rows
        else:  # a side request, the compacted one
            assert cached >= system_and_tools, rows
        if request.kind == "main":
            previous = prompt
    assert previous > 36_000, rows  # past the 32,768 tokens the old default held
    health = httpx.get(f"{qwen_server.base_url}/health", timeout=30).json()
    key = {"Authorization": f"Bearer {API_KEY}"}
    metrics = httpx.get(f"{qwen_server.base_url}/metrics", headers=key, timeout=30).text
    per_token = next(
        float(line.split()[1]) for line in metrics.splitlines()
        if line.startswith("mlxcore_memory_kv_bytes_per_token ")
    )  # fmt: skip
    assert health["memory"]["prefix_cache_budget_bytes"] > 4 * 32_768 * per_token
