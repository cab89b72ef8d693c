"""Structured output over HTTP: response_format and forced tool choice, enforced by
constrained decoding on a real (random-weight) model, through the official clients."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from tool_definitions import TIME

from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

API_KEY = "test-key"  # as qwen_server in conftest.py
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def client(qwen_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen_server.v1, api_key=API_KEY, max_retries=0)


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("messages", [{"role": "user", "content": "Describe someone."}])
    kwargs.setdefault("max_tokens", 120)
    return client.chat.completions.create(model="tiny-qwen3", extra_body=NO_THINKING, **kwargs)


def check_person(value: Any) -> None:
    assert set(value) == {"name", "age", "role"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 120
    assert value["role"] in ("admin", "user")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_response_validates(client: openai.OpenAI, temperature: float) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    reply = chat(client, response_format=fmt, temperature=temperature, seed=3)
    check_person(json.loads(reply.choices[0].message.content))
    assert reply.choices[0].finish_reason == "stop"


def test_json_object_response_and_stream_agree(client: openai.OpenAI) -> None:
    fmt = {"type": "json_object"}
    reply = chat(client, response_format=fmt, temperature=0)
    text = reply.choices[0].message.content
    assert text.startswith("{")
    if reply.choices[0].finish_reason == "stop":  # a random model may write one long key
        assert isinstance(json.loads(text), dict)
    else:
        assert reply.choices[0].finish_reason == "length"
    stream = chat(client, response_format=fmt, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text


def test_named_tool_choice_yields_that_call(client: openai.OpenAI) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    reply = chat(client, tools=[WEATHER, TIME], tool_choice=choice, temperature=0)
    message = reply.choices[0].message
    [call] = message.tool_calls
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments)["zone"] in ("UTC", "CET")
    assert reply.choices[0].finish_reason == "tool_calls"


def test_required_tool_choice_yields_known_calls(client: openai.OpenAI) -> None:
    reply = chat(client, tools=[WEATHER, TIME], tool_choice="required", temperature=1.0, seed=5)
    calls = reply.choices[0].message.tool_calls
    assert calls, reply
    for call in calls:
        assert call.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(call.function.arguments), dict)


def test_bad_structured_requests_are_400s_naming_the_field(client: openai.OpenAI) -> None:
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, response_format=bad_schema)
    assert err.value.body["param"] == "response_format"  # type: ignore[index]
    unknown = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, tools=[WEATHER], tool_choice=unknown)
    assert err.value.body["param"] == "tool_choice"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        chat(client, response_format={"type": "yaml"})


def test_anthropic_forced_tool_choice(qwen_server: Server) -> None:
    client = anthropic.Anthropic(base_url=qwen_server.base_url, api_key=API_KEY, max_retries=0)
    tool = {
        "name": "get_weather",
        "description": "Weather",
        "input_schema": WEATHER["function"]["parameters"],  # type: ignore[index]
    }
    msg = client.messages.create(
        model="tiny-qwen3",
        max_tokens=80,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    [block] = msg.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert set(block.input) == {"city"}
    assert msg.stop_reason == "tool_use"
