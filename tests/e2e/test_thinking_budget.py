"""Thinking budgets over HTTP, on the tiny hybrid Qwen3.5 (its template opens the think
block in the prompt) and the tiny Qwen3 (the model opens it: scripted here), through the
OpenAI chat, Anthropic Messages and Responses routes.

The random weights never close a think block by themselves: every closed block below
was closed by the server when the budget was spent. ``ignore_eos`` keeps the model
writing after it, so an answer follows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

DEFAULT_BUDGET = 16
HI = [{"role": "user", "content": "Think, then answer."}]


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3_5: Path) -> Server:
    return mlxcore_server(
        tiny_qwen3_5,
        "--served-model-name", "tiny35",
        "--thinking-token-budget", str(DEFAULT_BUDGET),
    )  # fmt: skip


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)


def chat(client: openai.OpenAI, stream: bool = False, **extra: Any) -> tuple[str, str, Any]:
    """(reasoning, content, usage) of one greedy chat completion."""
    answer = client.chat.completions.create(
        model="tiny35", messages=HI, max_tokens=DEFAULT_BUDGET + 24, temperature=0,  # type: ignore[arg-type]
        stream=stream, extra_body={"ignore_eos": True, **extra},
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )  # fmt: skip
    if not stream:
        message: Any = answer.choices[0].message  # type: ignore[union-attr]
        reasoning = getattr(message, "reasoning_content", None) or ""
        return reasoning, message.content or "", answer.usage  # type: ignore[union-attr]
    reasoning, content, usage = "", "", None
    for chunk in answer:  # type: ignore[union-attr]
        usage = chunk.usage or usage
        if chunk.choices:
            delta: Any = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    return reasoning, content, usage


@pytest.mark.parametrize(
    ("extra", "budget"),
    [
        ({}, DEFAULT_BUDGET),
        ({"thinking_token_budget": 5}, 5),
        ({"reasoning_max_tokens": 7}, 7),
        ({"thinking_budget": 3}, 3),
        ({"thinking_token_budget": 0}, 0),
    ],
)
def test_chat_thinks_at_most_the_budget_then_answers(
    client: openai.OpenAI, extra: dict[str, Any], budget: int
) -> None:
    reasoning, content, usage = chat(client, **extra)
    assert usage.completion_tokens_details.reasoning_tokens == budget
    assert bool(reasoning.strip()) == (budget > 0)
    assert content.strip(), "an answer follows the closed think block"
    assert "</think>" not in content + reasoning
    streamed = chat(client, stream=True, **extra)
    assert streamed[:2] == (reasoning, content)
    assert streamed[2].completion_tokens_details.reasoning_tokens == budget


def test_budgets_hold_in_one_batch(client: openai.OpenAI) -> None:
    from concurrent.futures import ThreadPoolExecutor

    budgets = [2, 9, 4, 12, 6, 1]
    with ThreadPoolExecutor(len(budgets)) as pool:
        got = list(pool.map(lambda b: chat(client, thinking_token_budget=b), budgets))
    for budget, (_, content, usage) in zip(budgets, got, strict=True):
        assert usage.completion_tokens_details.reasoning_tokens == budget
        assert content.strip()


def test_a_constraint_starts_right_after_the_forced_close(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
              "maximum": 9}}, "required": ["n"]}  # fmt: skip
    answer = client.chat.completions.create(
        model="tiny35", messages=HI, max_tokens=40, temperature=0,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        extra_body={"thinking_token_budget": 4},
    )  # fmt: skip
    assert answer.usage is not None
    assert answer.usage.completion_tokens_details.reasoning_tokens == 4  # type: ignore[union-attr]
    assert 0 <= json.loads(answer.choices[0].message.content or "")["n"] <= 9


def test_bad_budgets_are_400s_naming_the_field(client: openai.OpenAI) -> None:
    for extra, param in [
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
        ({"reasoning_max_tokens": "many"}, "reasoning_max_tokens"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ]:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny35", messages=HI, extra_body=extra)  # type: ignore[arg-type]
        assert err.value.body["param"] == param  # type: ignore[index]


def test_anthropic_budget_tokens(server: Server, client: openai.OpenAI) -> None:
    """The same greedy thinking as chat completions with the same budget, where usage
    counts it."""
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    message = claude.messages.create(
        model="tiny35", max_tokens=DEFAULT_BUDGET + 24, messages=HI,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 6},
        extra_body={"ignore_eos": True, "temperature": 0},
    )  # fmt: skip
    kinds = [block.type for block in message.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    reasoning, content, usage = chat(client, thinking_token_budget=6)
    assert usage.completion_tokens_details.reasoning_tokens == 6
    assert message.content[0].thinking == reasoning  # type: ignore[union-attr]
    assert "".join(b.text for b in message.content if b.type == "text") == content  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(
            model="tiny35",
            max_tokens=30,
            messages=HI,  # type: ignore[arg-type]
            thinking={"type": "enabled", "budget_tokens": -5},
        )


def test_responses_reports_reasoning_tokens_within_the_budget(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model="tiny35", input="Think, then answer.", max_output_tokens=40,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert resp.usage is not None
    assert resp.usage.output_tokens_details.reasoning_tokens == DEFAULT_BUDGET
    kinds = [item.type for item in resp.output]
    assert kinds[0] == "reasoning" and "message" in kinds, kinds
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny35", input="x", reasoning={"effort": "huge"})  # type: ignore[typeddict-item]
    assert err.value.body["param"] == "reasoning.effort"  # type: ignore[index]


def test_qwen3_model_that_opens_its_own_think_block(scripted_server: Server) -> None:
    client = openai.OpenAI(base_url=scripted_server.v1, api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=30, temperature=0,  # type: ignore[arg-type]
        extra_body={"test_script": "<think>\n", "test_script_then": "free",
                    "thinking_token_budget": 6, "ignore_eos": True},
    )  # fmt: skip
    assert answer.usage is not None
    assert answer.usage.completion_tokens_details.reasoning_tokens == 6  # type: ignore[union-attr]
    message: Any = answer.choices[0].message
    assert message.reasoning_content and message.content
