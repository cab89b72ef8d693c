"""Structured output over HTTP: response_format and forced tool choice, enforced by
constrained decoding on a real (random-weight) model, through the official clients."""

from __future__ import annotations

import json
import re
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


# -- user grammars: vLLM's structured_outputs / guided_*, response_format grammar ------------

REGEX = r"(yes|no) [0-9]{1,3}"


def _text(answer: Any, stream: bool, chat_api: bool) -> str:
    if not stream:
        return str(answer.choices[0].message.content if chat_api else answer.choices[0].text)
    if chat_api:
        return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    return "".join(c.choices[0].text for c in answer if c.choices)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("fields", "fits"),
    [
        ({"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
        ({"guided_choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
        ({"guided_grammar": 'root ::= "x=" [0-9] ";"'}, lambda t: re.fullmatch(r"x=[0-9];", t)),
        ({"structured_outputs": {"json": PERSON}}, lambda t: check_person(json.loads(t)) is None),
        ({"response_format": {"type": "grammar", "grammar": 'start: "ok" | "no"'}},
         lambda t: t in ("ok", "no")),
    ],
)  # fmt: skip
def test_user_grammars_constrain_chat_and_completions(
    client: openai.OpenAI, fields: dict[str, Any], fits: Any, stream: bool
) -> None:
    fields = dict(fields)
    response_format = fields.pop("response_format", None)
    extra: dict[str, Any] = {**NO_THINKING, **fields}
    if response_format is not None:
        extra["response_format"] = response_format
    answer = client.chat.completions.create(
        model="tiny-qwen3", messages=[{"role": "user", "content": "Answer."}], max_tokens=60,
        temperature=1.0, seed=3, stream=stream, extra_body=extra,
    )  # fmt: skip
    text = _text(answer, stream, chat_api=True)
    assert fits(text), text
    extra.pop("chat_template_kwargs")
    answer = client.completions.create(
        model="tiny-qwen3", prompt="Answer:", max_tokens=60, stream=stream, extra_body=extra
    )
    text = _text(answer, stream, chat_api=False)
    assert fits(text), text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_regex": "[a-"}, "guided_regex"),
        ({"structured_outputs": {"grammar": "start: missing"}}, "structured_outputs.grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_json": {"type": 5}}, "guided_json"),
        ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice"),
        ({"response_format": {"type": "grammar", "grammar": "root ::= ("}},
         "response_format.grammar"),
    ],
)  # fmt: skip
def test_bad_user_grammars_are_400s_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str
) -> None:
    for create in (
        lambda: client.chat.completions.create(
            model="tiny-qwen3", messages=[{"role": "user", "content": "x"}], extra_body=fields
        ),
        lambda: client.completions.create(model="tiny-qwen3", prompt="x", extra_body=fields),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            create()
        assert err.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize("extra", [{"ignore_eos": True}, {"top_p": 5e-324, "seed": 0}])
def test_a_constraint_ends_the_output_whatever_the_sampling(
    client: openai.OpenAI, extra: dict[str, Any]
) -> None:
    """The constraint's end ends the output with ``ignore_eos`` too, and a vanishing
    ``top_p`` (float32 rounds it to 0) keeps the draw inside the grammar (both were a 500:
    the contract run's schemathesis found the second)."""
    answer = client.completions.create(
        model="tiny-qwen3", prompt="Answer:", max_tokens=40, n=2,
        extra_body={"guided_regex": "abcdefghij", **extra},
    )  # fmt: skip
    assert [c.text for c in answer.choices] == ["abcdefghij"] * 2
    assert {c.finish_reason for c in answer.choices} == {"stop"}
