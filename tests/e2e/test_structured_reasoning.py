"""Constraints hold whether or not the model thinks, and schemas without a finite instance
are refused on every route, over HTTP with the official clients.

With a reasoning parser active, a json_schema or forced tool choice used to start only
after ``</think>``: a model that never thinks (SmolLM2 under ``--reasoning-parser think``)
or did not this time (the tiny Qwen3 with thinking on) wrote free text. Now the
constraint holds from the first token unless the output opens a think block there.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from tool_definitions import TIME

from mlxcore.models.default import ensure_default_model
from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

API_KEY = "test-key"  # as qwen_server in conftest.py
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
ENDLESS = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
THINKING = {"on": {}, "off": {"chat_template_kwargs": {"enable_thinking": False}}}


@pytest.fixture(scope="module")
def smollm(mlxcore_server: Any) -> Server:
    """SmolLM2 (which never thinks) with the think reasoning parser forced on."""
    server: Server = mlxcore_server(
        ensure_default_model(), "--served-model-name", "smol", "--reasoning-parser", "think"
    )
    return server


def person(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int), text


@pytest.mark.parametrize("stream", [False, True])
def test_smollm_with_a_reasoning_parser_writes_the_schema(smollm: Server, stream: bool) -> None:
    client = openai.OpenAI(base_url=smollm.v1, api_key="x", max_retries=0)
    kwargs: dict[str, Any] = {
        "model": "smol",
        "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "max_tokens": 60,
        "temperature": 0,
        "response_format": FORMAT,
    }
    content, _, finish, _ = ask(client, stream, **kwargs)
    person(content)
    assert finish == "stop"


def ask(client: openai.OpenAI, stream: bool, **kwargs: Any) -> tuple[str, str, str, list[Any]]:
    """One chat request, streamed or not: (content, reasoning, finish reason, calls as
    (name, arguments) pairs)."""
    kwargs.setdefault("messages", [{"role": "user", "content": "Describe someone."}])
    kwargs.setdefault("max_tokens", 60)
    kwargs.setdefault("temperature", 0)
    if not stream:
        reply = client.chat.completions.create(**kwargs)
        message = reply.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        reasoning = getattr(message, "reasoning_content", None) or ""
        return message.content or "", reasoning, reply.choices[0].finish_reason, calls
    content = reasoning = finish = name = arguments = ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or []:
            name += call.function.name or "" if call.function else ""
            arguments += call.function.arguments or "" if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return content, reasoning, finish, [(name, arguments)] if name else []


CHOICE = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_holds_the_schema_and_the_forced_tool_with_thinking_off(
    scripted_server: Server, stream: bool
) -> None:
    client = openai.OpenAI(base_url=scripted_server.v1, api_key="x", max_retries=0)
    off = {"model": "tiny", "extra_body": THINKING["off"]}
    content, _, finish, _ = ask(client, stream, response_format=FORMAT, **off)
    person(content)
    assert finish == "stop"
    _, _, finish, calls = ask(client, stream, tools=[TIME], tool_choice=CHOICE, **off)
    [(name, arguments)] = calls
    assert name == "get_time" and json.loads(arguments)["zone"] in ("UTC", "CET")
    assert finish == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_with_thinking_on_is_held_from_the_first_token_when_it_does_not_think(
    scripted_server: Server, stream: bool
) -> None:
    """Thinking on, and the model's first token is not ``<think>`` (greedy on this model):
    the schema holds from the first token (it used to wait for ``</think>``: free text)."""
    client = openai.OpenAI(base_url=scripted_server.v1, api_key="x", max_retries=0)
    content, reasoning, finish, _ = ask(client, stream, model="tiny", response_format=FORMAT)
    person(content)
    assert finish == "stop" and not reasoning


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_that_thinks_first_is_free_until_the_block_closes_then_held(
    scripted_server: Server, stream: bool
) -> None:
    """Thinking on, and the model opens its reasoning (the scripted test plugin writes
    the block, then lets the model go on): free inside, the constraint after it."""
    client = openai.OpenAI(base_url=scripted_server.v1, api_key="x", max_retries=0)
    think = {"test_script": "<think>\nLet me see.\n</think>", "test_script_then": "free"}
    content, reasoning, finish, _ = ask(
        client, stream, model="tiny", response_format=FORMAT, extra_body=think
    )
    person(content)
    assert "Let me see." in reasoning and finish == "stop"
    _, reasoning, finish, calls = ask(
        client, stream, model="tiny", tools=[TIME], tool_choice=CHOICE, extra_body=think
    )
    [(name, arguments)] = calls
    assert name == "get_time" and json.loads(arguments)["zone"] in ("UTC", "CET")
    assert "Let me see." in reasoning and finish == "tool_calls"


def test_a_schema_without_a_finite_instance_is_a_400_on_every_route(
    qwen_server: Server,
) -> None:
    client = openai.OpenAI(base_url=qwen_server.v1, api_key=API_KEY, max_retries=0)
    endless = {"type": "json_schema", "json_schema": {"name": "e", "schema": ENDLESS}}
    messages = [{"role": "user", "content": "JSON please"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-qwen3", messages=messages, response_format=endless
        )  # type: ignore[arg-type]
    assert err.value.body["param"] == "response_format"  # type: ignore[index]
    assert "no finite instance" in err.value.body["message"]  # type: ignore[index]

    looping = {"type": "function", "function": {"name": "loop", "parameters": ENDLESS}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="tiny-qwen3",
            messages=messages,
            tools=[TIME, looping],
            tool_choice="required",  # type: ignore[list-item]
        )
    assert err.value.body["param"] == "tools[1].function.parameters"  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model="tiny-qwen3", prompt="JSON:", extra_body={"response_format": endless}
        )
    assert err.value.body["param"] == "response_format"  # type: ignore[index]

    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="tiny-qwen3",
            input="JSON please",
            text={"format": {"type": "json_schema", "name": "e", "schema": ENDLESS}},
        )
    assert "no finite instance" in str(err.value)

    claude = anthropic.Anthropic(base_url=qwen_server.base_url, api_key=API_KEY, max_retries=0)
    tool = {"name": "loop", "description": "Loop", "input_schema": ENDLESS}
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(
            model="tiny-qwen3", max_tokens=20, messages=[{"role": "user", "content": "Go"}],  # type: ignore[list-item]
            tools=[tool], tool_choice={"type": "any"},  # type: ignore[list-item]
        )  # fmt: skip
    assert "no finite instance" in str(bad.value)
    # the server is fine afterwards
    assert httpx.get(f"{qwen_server.base_url}/health", timeout=10).status_code == 200


def test_completions_honour_a_json_schema(qwen_server: Server) -> None:
    """vLLM's ``response_format`` on /v1/completions."""
    client = openai.OpenAI(base_url=qwen_server.v1, api_key=API_KEY, max_retries=0)
    reply = client.completions.create(
        model="tiny-qwen3",
        prompt="A person as JSON:",
        max_tokens=60,
        temperature=0,
        extra_body={"response_format": FORMAT},
    )
    person(reply.choices[0].text)
    assert reply.choices[0].finish_reason == "stop"


def test_a_constraint_the_tokenizer_cannot_follow_is_a_400_not_a_500(smollm: Server) -> None:
    """A regex forcing a rare 4-byte character, which llguidance cannot produce with
    SmolLM2's byte tokens (a 500 in the reliability fuzz): a 400, or an error event once
    the stream has begun, naming the constraint; the server serves on."""
    client = openai.OpenAI(base_url=smollm.v1, api_key="x", max_retries=0)
    rare = {"structured_outputs": {"regex": "ok\U00055950"}}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smol", prompt="Say:", max_tokens=8, extra_body=rare)
    body: Any = err.value.body
    assert body["code"] == "unsatisfiable_constraint" and "cannot be followed" in body["message"]
    with pytest.raises(openai.APIError, match="cannot be followed"):
        for _ in client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "Say ok."}], max_tokens=8,
            stream=True, extra_body=rare,
        ):  # fmt: skip
            pass
    reply = client.completions.create(model="smol", prompt="Say:", max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason == "length"
