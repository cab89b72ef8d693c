"""The OpenAI Agents SDK (``openai-agents`` from PyPI) against a real server, with its
default model (the Responses API) and with its Chat Completions model.

The scripted test plugin makes the random model call the agent's tool; the SDK parses
the call from our output items (or chat deltas), runs the Python function and ends the
run with its result (``stop_on_first_tool``); a second agent without tools answers in
text. Streamed runs go through the SDK's own event parsing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

if TYPE_CHECKING:
    from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def server(scripted_server: Server) -> Server:
    set_tracing_disabled(True)
    return scripted_server


@pytest.fixture
def client(server: Server) -> Iterator[AsyncOpenAI]:
    yield AsyncOpenAI(base_url=server.v1, api_key="none", max_retries=0)


def model(kind: str, client: AsyncOpenAI) -> Any:
    if kind == "responses":
        return OpenAIResponsesModel(model="gpt-5-mini", openai_client=client)
    return OpenAIChatCompletionsModel(model="gpt-5-mini", openai_client=client)


def settings(script: str) -> ModelSettings:
    return ModelSettings(
        temperature=0,
        max_tokens=64,
        extra_body={"test_script": script, "chat_template_kwargs": {"enable_thinking": False}},
    )


@pytest.mark.parametrize("kind", ["responses", "chat"])
@pytest.mark.parametrize("streamed", [False, True])
def test_one_tool_agent_runs(kind: str, streamed: bool, client: AsyncOpenAI) -> None:
    calls.clear()
    agent = Agent(
        name="weather",
        instructions="Answer with the tool.",
        tools=[get_weather],
        model=model(kind, client),
        model_settings=settings(CALL),
        tool_use_behavior="stop_on_first_tool",
    )

    async def run() -> Any:
        if not streamed:
            return await Runner.run(agent, "Weather in Paris?")
        result = Runner.run_streamed(agent, "Weather in Paris?")
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert calls == ["Paris"]
    assert result.final_output == "sunny in Paris"


@pytest.mark.parametrize("kind", ["responses", "chat"])
def test_text_agent_answers(kind: str, client: AsyncOpenAI) -> None:
    agent = Agent(
        name="greeter",
        instructions="Be brief.",
        model=model(kind, client),
        model_settings=settings("Hello from mlxcore."),
    )
    result = asyncio.run(Runner.run(agent, "Say hello"))
    assert result.final_output == "Hello from mlxcore."
