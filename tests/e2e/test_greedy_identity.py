"""Greedy output over HTTP is token-identical to `mlx_lm.generate` on the same model
and prompt: alone, inside a batch of eight, streaming and not, and on a follow-up turn
that reuses a cached prefix. The model is the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from mlxcore.models.default import ensure_default_model
from mlxcore.prompts import render_chat
from mlxcore.testing.server import Server, ServerFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write one sentence about the sea.",
    "What is 12 times 12?",
    "Give me a synonym for happy.",
    "Why is the sky blue? One sentence.",
    "List two fruits.",
    "Say hello in Spanish.",
]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def model_path() -> Path:
    return ensure_default_model()


@pytest.fixture(scope="module")
def reference(model_path: Path) -> Any:
    model, tokenizer = load(str(model_path))
    known: dict[str, str] = {}

    def generate(messages: list[dict[str, str]]) -> str:
        key = repr(messages)
        if key not in known:
            known[key] = reference_text(messages)
        return known[key]

    def reference_text(messages: list[dict[str, str]]) -> str:
        ids = render_chat(tokenizer, messages).ids
        sampler = make_sampler(0.0)
        pieces = [
            r.text
            for r in stream_generate(model, tokenizer, ids, max_tokens=MAX_TOKENS, sampler=sampler)
        ]
        return "".join(pieces)

    return generate


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, model_path: Path) -> Server:
    return mlxcore_server(model_path, "--served-model-name", "smol", "--refuse-unrenderable-tools")


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, messages: list[dict[str, str]], stream: bool = False) -> str:
    kwargs: dict[str, Any] = {"model": "smol", "messages": messages, "max_tokens": MAX_TOKENS}
    if stream:
        chunks = client.chat.completions.create(stream=True, temperature=0, **kwargs)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(temperature=0, **kwargs)
    return reply.choices[0].message.content or ""


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_alone_stream_and_non_stream_match_mlx_lm(client: openai.OpenAI, reference: Any) -> None:
    expected = reference(user(QUESTIONS[0]))
    assert "Paris" in expected
    assert ask(client, user(QUESTIONS[0])) == expected
    assert ask(client, user(QUESTIONS[0]), stream=True) == expected


def test_eight_at_once_each_match_mlx_lm(client: openai.OpenAI, reference: Any) -> None:
    expected = [reference(user(q)) for q in QUESTIONS]
    with concurrent.futures.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        streams = [i % 2 == 0 for i in range(len(QUESTIONS))]
        got = list(
            pool.map(lambda a: ask(client, user(a[0]), a[1]), zip(QUESTIONS, streams, strict=True))
        )
    assert got == expected


def test_cached_prefix_follow_up_matches_mlx_lm(client: openai.OpenAI, reference: Any) -> None:
    system = {"role": "system", "content": "You answer in one short sentence. " * 40}
    first = [system, {"role": "user", "content": QUESTIONS[1]}]
    answer = ask(client, first)
    follow = [*first, {"role": "assistant", "content": answer}, *user(QUESTIONS[3])]
    raw = client.chat.completions.create(
        model="smol", messages=follow, max_tokens=MAX_TOKENS, temperature=0
    )
    assert raw.usage.prompt_tokens_details.cached_tokens > 200
    assert raw.choices[0].message.content == reference(follow)


def test_tools_the_template_cannot_show_are_refused_when_asked(server: Server) -> None:
    """SmolLM2's chat template has no tools: under ``--refuse-unrenderable-tools`` a
    request with tools is a 400 naming them (by default: served without, and a warning)."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Weather?"}],
        "max_tokens": 4,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
    }
    refused = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tools"
    body.pop("tools")
    assert httpx.post(f"{server.v1}/chat/completions", json=body, timeout=60).status_code == 200
