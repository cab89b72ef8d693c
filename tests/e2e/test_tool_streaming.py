"""Tool calls and reasoning end to end: the official ``openai`` client, real servers.

One ``mlxcore serve`` per family (parsers chosen by ``auto`` from the model), with
the scripted test plugin: a request's ``test_script`` makes the real tiny model
write exactly that text, token by token through the family's tokenizer (so
``<tool_call>``, ``<|tool_call>``, ``<|"|>``, ``<think>`` and ``<|channel>`` are the
real special tokens), and the server's output pipeline parses it. Checked over
HTTP, streaming and not: ``tool_calls`` deltas (id and name first, then the
arguments), no markup in ``content``, ``finish_reason`` ``tool_calls``, reasoning in
``reasoning_content``, and the streamed message equal to the non-streamed one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import openai
import pytest

from mlxcore.testing.conformance import DEFAULT_TOOLS

if TYPE_CHECKING:
    from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

MODEL = "tiny"
Q = '<|"|>'
MARKUP = (
    "<tool_call",
    "</tool_call",
    "<function=",
    "<parameter",
    "<think",
    "</think",
    "<|",
    "|>",
    "call:",
    "<channel",
    "[Calling tool",
)
"""Text that must never reach ``content`` for these scripts."""


@attrs.frozen
class Scenario:
    """A scripted model output and the message the server must make of it."""

    id: str
    family: str
    script: str
    content: str
    reasoning: str
    calls: tuple[tuple[str, dict[str, Any]], ...]
    thinking: bool = True


HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
HERMES_CALL += "</tool_call>"
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
GEMMA_CALL = f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>"
PARIS = ("get_weather", {"city": "Paris", "days": 3})
SEARCH_JP = ("search", {"query": 'café "東京" {x}'})

SCENARIOS = [
    Scenario(
        "hermes-think-text-call",
        "qwen3",
        "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n" + HERMES_CALL,
        "Let me check.",
        "The user wants the weather.",
        (PARIS,),
    ),
    Scenario(
        "hermes-two-calls-unicode",
        "qwen3",
        "<think>\n\n</think>\n\n"
        + HERMES_CALL
        + '\n<tool_call>\n{"name": "search", "arguments": {"query": "café \\"東京\\" {x}"}}\n'
        + "</tool_call>",
        "",
        "",
        (PARIS, SEARCH_JP),
    ),
    Scenario(
        "qwen3-coder-prompt-opened-think-call",
        "qwen3_5",
        "I should look it up.\n</think>\n\nOne moment.\n\n" + XML_CALL,
        "One moment.",
        "I should look it up.",
        (PARIS,),
    ),
    Scenario(
        "qwen3-coder-thinking-off-two-calls",
        "qwen3_5",
        XML_CALL
        + '\n<tool_call>\n<function=search>\n<parameter=query>\ncafé "東京" {x}\n'
        + "</parameter>\n</function>\n</tool_call>",
        "",
        "",
        (PARIS, SEARCH_JP),
        thinking=False,
    ),
    Scenario(
        "gemma4-thought-call-text",
        "gemma4",
        "<|channel>thought\nWeather first.<channel|>" + GEMMA_CALL + "Checking.",
        "Checking.",
        "Weather first.",
        (PARIS,),
    ),
    Scenario(
        "gemma4-two-calls-no-thinking",
        "gemma4",
        GEMMA_CALL + f'<|tool_call>call:search{{query:{Q}café "東京" {{x}}{Q}}}<tool_call|>',
        "",
        "",
        (PARIS, SEARCH_JP),
        thinking=False,
    ),
]


@pytest.fixture(scope="module")
def servers(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, tiny_qwen3_5: Path, tiny_gemma4: Path
) -> dict[str, Server]:
    """One server per family, started on first use, with the scripted test plugin."""
    paths = {"qwen3": tiny_qwen3, "qwen3_5": tiny_qwen3_5, "gemma4": tiny_gemma4}

    class Lazy(dict[str, "Server"]):
        def __missing__(self, family: str) -> Server:
            server = mlxcore_server(
                paths[family],
                "--served-model-name",
                MODEL,
                "--plugin",
                "mlxcore.testing.scripted",
            )
            self[family] = server
            return server

    return Lazy()


@pytest.fixture
def client_for(servers: dict[str, Server]) -> Iterator[Any]:
    """``client_for(family)``: an OpenAI client on that family's server (no retries)."""
    clients: list[openai.OpenAI] = []

    def make(family: str) -> openai.OpenAI:
        client = openai.OpenAI(
            base_url=servers[family].v1, api_key="unused", max_retries=0, timeout=120
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
    for family, server in servers.items():
        assert server.alive(), f"the {family} server died:\n{server.log()}"


def request(scenario: Scenario, **kwargs: Any) -> dict[str, Any]:
    """The chat request for ``scenario`` (tools declared, thinking as the scenario says)."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": list(DEFAULT_TOOLS),
        "max_tokens": 200,
        "extra_body": {
            "test_script": scenario.script,
            "chat_template_kwargs": {"enable_thinking": scenario.thinking},
        },
        **kwargs,
    }


def parsed_calls(calls: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    """``(name, arguments text)`` pairs with the arguments parsed."""
    return [(name, json.loads(arguments)) for name, arguments in calls]


def streamed(client: openai.OpenAI, scenario: Scenario) -> dict[str, Any]:
    """Stream ``scenario``; check the tool-call delta protocol; return the reassembled message."""
    content, reasoning, finish = [], [], []
    calls: dict[int, dict[str, Any]] = {}
    order: list[tuple[int, str]] = []
    for chunk in client.chat.completions.create(**request(scenario, stream=True)):
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            extra = getattr(delta, "reasoning_content", None)
            if extra:
                reasoning.append(extra)
            for tc in delta.tool_calls or []:
                if tc.index not in calls:
                    # first delta of a call: id, type and name, arguments still empty
                    assert tc.id and tc.id.startswith("call_"), tc
                    assert tc.type == "function" and tc.function and tc.function.name, tc
                    assert not tc.function.arguments, f"arguments before the name: {tc}"
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                    order.append((tc.index, "head"))
                else:
                    assert tc.id in (None, calls[tc.index]["id"]), tc
                    assert tc.function is not None and tc.function.arguments is not None, tc
                    calls[tc.index]["arguments"] += tc.function.arguments
                    order.append((tc.index, "arguments"))
            if choice.finish_reason is not None:
                finish.append(choice.finish_reason)
    for index in calls:  # every call: its head strictly before its arguments
        kinds = [kind for i, kind in order if i == index]
        assert kinds[0] == "head" and "arguments" in kinds[1:], order
    assert sorted(calls) == list(range(len(calls))), "tool call indexes must be 0, 1, ..."
    assert len(finish) == 1, f"one finish_reason expected, got {finish}"
    return {
        "content": "".join(content),
        "pieces": content,
        "reasoning": "".join(reasoning),
        "calls": [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)],
        "finish_reason": finish[0],
    }


def complete(client: openai.OpenAI, scenario: Scenario) -> dict[str, Any]:
    """``scenario`` non-streamed, as the same dictionary shape as :func:`streamed`."""
    response = client.chat.completions.create(**request(scenario))
    (choice,) = response.choices
    message = choice.message
    calls = message.tool_calls or []
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    return {
        "content": message.content or "",
        "reasoning": getattr(message, "reasoning_content", None) or "",
        "calls": [(c.function.name, c.function.arguments) for c in calls],
        "finish_reason": choice.finish_reason,
    }


def params(scenarios: list[Scenario]) -> list[Any]:
    """``scenarios`` as pytest params, the Gemma 4 ones marked with the known server bug."""
    return [pytest.param(s, id=s.id) for s in scenarios]


@pytest.mark.parametrize("scenario", params(SCENARIOS))
def test_streamed_tool_calls_and_reasoning(client_for: Any, scenario: Scenario) -> None:
    got = streamed(client_for(scenario.family), scenario)
    for piece in got["pieces"]:
        leaked = [m for m in MARKUP if m in piece]
        assert not leaked, f"markup {leaked} in a content delta: {piece!r}"
    assert got["content"] == scenario.content
    assert got["reasoning"] == scenario.reasoning
    assert parsed_calls(got["calls"]) == list(scenario.calls)
    assert got["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("scenario", params(SCENARIOS))
def test_streamed_equals_non_streamed(client_for: Any, scenario: Scenario) -> None:
    client = client_for(scenario.family)
    plain = complete(client, scenario)
    stream = streamed(client, scenario)
    stream.pop("pieces")
    assert stream == plain
    assert plain["finish_reason"] == "tool_calls"
    assert parsed_calls(plain["calls"]) == list(scenario.calls)
    assert plain["content"] == scenario.content and plain["reasoning"] == scenario.reasoning


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "gemma4"])
def test_without_tools_the_text_is_content_and_finish_is_stop(client_for: Any, family: str) -> None:
    """A request without ``tools`` never gets tool calls: the same markup stays text."""
    scenario = next(s for s in SCENARIOS if s.family == family and not s.reasoning)
    body = request(scenario)
    body.pop("tools")
    response = client_for(family).chat.completions.create(**body)
    (choice,) = response.choices
    assert not choice.message.tool_calls
    assert choice.finish_reason == "stop"
