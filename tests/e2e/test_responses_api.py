"""The Responses API through the official ``openai`` client, against a real server.

``tiny_qwen3`` with the scripted test plugin (a request's ``test_script`` makes the real
model write that text, so tool calls and reasoning come out of the real tokenizer and
output pipeline). Checked: created / streamed / retrieved / listed / deleted responses,
the typed event sequence, streaming == non-streaming, a function-calling round trip
with ``function_call_output``, ``previous_response_id`` chains hitting the prefix cache,
``text.format`` json_schema, reasoning items and their portable form, and errors in
OpenAI's shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

if TYPE_CHECKING:
    from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

MODEL = "tiny"
NO_THINKING = {"enable_thinking": False}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["age", "role"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(scripted_server: Server) -> Server:
    return scripted_server


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=120) as c:
        yield c


def create(client: openai.OpenAI, script: str | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("model", MODEL)
    kwargs.setdefault("max_output_tokens", 24)
    kwargs.setdefault("temperature", 0)
    body = dict(kwargs.pop("extra_body", {}))
    body.setdefault("chat_template_kwargs", NO_THINKING)
    if script is not None:
        body["test_script"] = script
    return client.responses.create(extra_body=body, **kwargs)


def test_create_returns_a_completed_response_with_usage(client: openai.OpenAI) -> None:
    resp = create(client, "Hello there.", input="Say hello")
    assert resp.object == "response" and resp.status == "completed"
    assert resp.model == MODEL
    assert resp.output_text == "Hello there."
    (message,) = resp.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    usage = resp.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens < usage.input_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


def test_stream_events_are_in_order_and_agree_with_the_non_streamed_response(
    client: openai.OpenAI,
) -> None:
    args = {"input": [{"role": "user", "content": "Tell me a story"}], "max_output_tokens": 12}
    plain = create(client, **args)
    events = list(create(client, stream=True, **args))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if plain.status == "incomplete" else "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == plain.output_text
    assert final.status == plain.status
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_stream_helper_gives_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL,
        input="Say hello",
        max_output_tokens=24,
        extra_body={"test_script": "Hi!", "chat_template_kwargs": NO_THINKING},
    ) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == "Hi!"


def test_retrieve_list_input_items_and_delete(client: openai.OpenAI) -> None:
    resp = create(
        client,
        "ok",
        input=[
            {"role": "user", "content": "first"},
            {"role": "user", "content": [{"type": "input_text", "text": "second"}]},
        ],
        instructions="Be brief.",
    )
    again = client.responses.retrieve(resp.id)
    assert again.id == resp.id and again.output_text == "ok"
    items = client.responses.input_items.list(resp.id, order="asc")
    texts = [item.content[0].text for item in items.data]  # type: ignore[union-attr]
    assert texts == ["first", "second"]
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(resp.id)
    assert err.value.status_code == 404 and "error" in err.value.response.json()


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    resp = create(client, "ok", input="hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_function_call_round_trip_and_the_chain_hits_the_prefix_cache(
    client: openai.OpenAI,
) -> None:
    first = create(client, CALL, input="What is the weather in Paris?", tools=[WEATHER_TOOL])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id and call.status == "completed"
    second = create(
        client,
        "It is sunny in Paris.",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == "It is sunny in Paris."
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens > 0
    # the same conversation resent as items (no server state) renders the same prompt
    resent = create(
        client,
        "It is sunny in Paris.",
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=[WEATHER_TOOL],
        store=False,
    )
    assert resent.usage.input_tokens == second.usage.input_tokens
    assert resent.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens - 8


def test_streamed_function_call_events(client: openai.OpenAI) -> None:
    events = list(create(client, CALL, input="Weather?", tools=[WEATHER_TOOL], stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done[0].arguments) == {"city": "Paris"}
    final = events[-1].response
    assert final.output[-1].type == "function_call"
    assert final.output[-1].arguments == done[0].arguments


def test_text_format_json_schema_is_enforced(client: openai.OpenAI) -> None:
    resp = create(
        client,
        input="Describe someone.",
        max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}},
    )
    value = json.loads(resp.output_text)
    assert set(value) == {"age", "role"} and value["role"] in ("admin", "user")


def test_reasoning_items_and_their_portable_form(client: openai.OpenAI) -> None:
    script = "<think>\nThe user greets me.\n</think>\n\nHello!"
    resp = create(
        client,
        script,
        input="Hi",
        reasoning={"effort": "medium"},
        include=["reasoning.encrypted_content"],
        extra_body={"chat_template_kwargs": {}},
    )
    reasoning, message = resp.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text.strip() == "The user greets me."
    assert reasoning.encrypted_content
    assert resp.output_text == "Hello!"
    assert resp.usage.output_tokens_details.reasoning_tokens > 0
    # sent back as input (stateless, as Codex does), it is accepted
    follow = create(
        client,
        "Fine.",
        input=[
            {"role": "user", "content": "Hi"},
            reasoning.model_dump(exclude_none=True),
            message.model_dump(exclude_none=True),
            {"role": "user", "content": "How are you?"},
        ],
        store=False,
    )
    assert follow.output_text == "Fine."


def test_max_output_tokens_gives_an_incomplete_response(client: openai.OpenAI) -> None:
    resp = create(client, "one two three four five six", input="Count", max_output_tokens=2)
    assert resp.status == "incomplete"
    assert resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"


def test_hosted_tools_are_skipped_and_namespaces_flattened(client: openai.OpenAI) -> None:
    tools: Any = [
        {"type": "web_search"},
        {"type": "namespace", "name": "weather", "description": "", "tools": [WEATHER_TOOL]},
    ]
    resp = create(client, CALL, input="Weather?", tools=tools)
    (call,) = [item for item in resp.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.namespace == "weather"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": [{"type": "banana"}]}, 400, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input[0].call_id"),
        ({"input": "hi", "previous_response_id": "resp_unknown"}, 404, "previous_response_id"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "hi", "temperature": 5}, 400, "temperature"),
        ({"input": "hi", "tool_choice": "sometimes"}, 400, "tool_choice"),
        ({"input": "hi", "background": True}, 400, "background"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, 400, "text.format"),
        ({"input": ""}, 400, "input"),
    ],
)
def test_bad_requests_are_refused_in_openai_shape(
    server: Server, body: dict[str, Any], status: int, param: str
) -> None:
    r = httpx.post(f"{server.v1}/responses", json={"model": MODEL, **body}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]


def test_unknown_response_routes_are_404(server: Server) -> None:
    for method, path in [
        ("GET", "/responses/resp_nope"),
        ("DELETE", "/responses/resp_nope"),
        ("POST", "/responses/resp_nope/cancel"),
        ("GET", "/responses/resp_nope/input_items"),
    ]:
        r = httpx.request(method, f"{server.v1}{path}", timeout=10)
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["code"] == "response_not_found"
