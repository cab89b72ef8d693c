"""The Anthropic Messages API through the official `anthropic` SDK, against a real
uvicorn server running a real tiny Qwen3 model. The scripted-output test plugin
makes the random-weight model write a chosen text, so thinking and tool use go
through the real engine and the real parsers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

pytestmark = pytest.mark.e2e

KEY = "anthropic-test-key"
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
TOOL_SCRIPT = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def server(mlxcore_server: Any, tiny_qwen3: Path) -> Any:
    return mlxcore_server(
        tiny_qwen3,
        "--plugin",
        "mlxcore.testing.scripted",
        "--served-model-name",
        "tiny",
        "--api-key",
        KEY,
    )


@pytest.fixture(scope="module")
def client(server: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)


def ask(client: anthropic.Anthropic, script: str, **kwargs: Any) -> Any:
    kwargs.setdefault("max_tokens", 64)
    kwargs.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return client.messages.create(model="tiny", extra_body={"test_script": script}, **kwargs)


def test_text_reply_with_usage(client: anthropic.Anthropic) -> None:
    msg = ask(client, "Hello there, friend.")
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "tiny"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "Hello there, friend."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 5
    assert msg.usage.output_tokens >= 5


def test_thinking_and_text_blocks(client: anthropic.Anthropic) -> None:
    script = "<think>\nThe user greets me.\n</think>\n\nHello!"
    msg = ask(client, script, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking.strip() == "The user greets me."
    assert msg.content[1].text == "Hello!"
    hidden = ask(client, script)  # thinking not requested: reasoning is not shown
    assert [b.type for b in hidden.content] == ["text"]
    assert "<think>" not in hidden.content[0].text


def test_tool_use_block(client: anthropic.Anthropic) -> None:
    msg = ask(client, TOOL_SCRIPT, tools=[WEATHER])
    assert msg.stop_reason == "tool_use"
    [block] = msg.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.input == {"city": "Paris", "days": 3}
    assert block.id.startswith("toolu_")


def test_tool_result_round_trip(client: anthropic.Anthropic) -> None:
    first = ask(client, TOOL_SCRIPT, tools=[WEATHER])
    call = first.content[0]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [c.model_dump() for c in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21C"}],
        },
    ]
    msg = ask(client, "It is sunny.", tools=[WEATHER], messages=messages)
    assert msg.content[0].text == "It is sunny."


def test_stream_event_sequence_matches_non_stream(client: anthropic.Anthropic) -> None:
    script = "<think>\nplan\n</think>\n\nCalling it." + TOOL_SCRIPT
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 96,
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "extra_body": {"test_script": script},
    }
    with client.messages.stream(**kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    plain = client.messages.create(**kwargs)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "message_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert [b.model_dump(exclude={"id"}) for b in final.content] == [
        b.model_dump(exclude={"id"}) for b in plain.content
    ]
    assert final.stop_reason == plain.stop_reason == "tool_use"
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_stop_sequences_and_max_tokens(client: anthropic.Anthropic) -> None:
    msg = ask(client, "one two three four", stop_sequences=[" three"])
    assert msg.content[0].text == "one two"
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == " three"
    short = ask(client, "alpha beta gamma delta epsilon zeta eta theta", max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_count_tokens_and_prefix_cache_reads(client: anthropic.Anthropic) -> None:
    system = "You are a careful assistant. " * 40
    messages = [{"role": "user", "content": "What is two plus two?"}]
    counted = client.messages.count_tokens(model="tiny", system=system, messages=messages)
    first = ask(client, "Four.", system=system, messages=messages)
    assert counted.input_tokens == first.usage.input_tokens + (
        first.usage.cache_read_input_tokens or 0
    )
    follow = ask(
        client,
        "Six.",
        system=system,
        messages=[
            *messages,
            {"role": "assistant", "content": "Four."},
            {"role": "user", "content": "And 3+3?"},
        ],
    )
    assert (follow.usage.cache_read_input_tokens or 0) > counted.input_tokens // 2


def test_errors_in_anthropic_shape(server: Any, client: anthropic.Anthropic) -> None:
    bad_key = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad_key.messages.create(
            model="tiny", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(
            model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    response = httpx.post(
        f"{server.base_url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
    )
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    response = httpx.post(
        f"{server.base_url}/v1/messages",
        headers={"x-api-key": KEY},
        json={"model": "tiny", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
    )
    assert response.status_code == 400 and "role" in response.json()["error"]["message"]


def test_plugin_options_are_validated_on_both_apis(server: Any) -> None:
    headers = {"x-api-key": KEY}
    body = {"model": "tiny", "max_tokens": 5, "test_script": 5}
    anthropic_reply = httpx.post(
        f"{server.base_url}/v1/messages",
        headers=headers,
        json={**body, "messages": [{"role": "user", "content": "x"}]},
    )
    assert anthropic_reply.status_code == 400
    assert "test_script" in anthropic_reply.json()["error"]["message"]
    openai_reply = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        headers=headers,
        json={**body, "messages": [{"role": "user", "content": "x"}]},
    )
    assert openai_reply.status_code == 400
    assert openai_reply.json()["error"]["param"] == "test_script"


def test_image_block_on_a_text_model_is_400_naming_it(client: anthropic.Anthropic) -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
    }
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "?"}, image]}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="tiny", max_tokens=4, messages=messages)
    assert "does not take images" in str(info.value)
    assert "messages[0].content[1]" in str(info.value)


# -- what agents send (Claude Code) ---------------------------------------------------------


def test_system_messages_inside_messages_are_accepted_and_keep_the_prefix(
    client: anthropic.Anthropic,
) -> None:
    """Claude Code puts ``role: system`` reminders among the messages for a model it does
    not know; the turns before them still come from the prefix cache."""
    history: list[Any] = [
        {"role": "user", "content": "What is two plus two? " * 20},
        {"role": "assistant", "content": "Four."},
    ]
    first = ask(client, "Four.", messages=history[:1])
    assert first.content[0].text == "Four."
    follow = ask(
        client,
        "Six.",
        messages=[
            *history,
            {"role": "system", "content": "<system-reminder>be brief</system-reminder>"},
            {"role": "user", "content": "And 3+3?"},
        ],
    )
    assert follow.content[0].text == "Six."
    assert (follow.usage.cache_read_input_tokens or 0) >= first.usage.input_tokens - 4


def test_adaptive_thinking_turns_thinking_on(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model="tiny",
        max_tokens=64,
        messages=[{"role": "user", "content": "Hi"}],
        extra_body={
            "test_script": "<think>\nhmm\n</think>\n\nHello.",
            "thinking": {"type": "adaptive"},
        },
    )
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking.strip() == "hmm"  # type: ignore[union-attr]


def test_stream_usage_agrees_between_message_start_and_message_delta(
    client: anthropic.Anthropic,
) -> None:
    system = "You answer in one word. " * 30
    messages = [{"role": "user", "content": "Colour of the sky?"}]
    ask(client, "Blue.", system=system, messages=messages)  # fills the prefix cache
    with client.messages.stream(
        model="tiny",
        max_tokens=16,
        system=system,
        messages=messages,
        extra_body={"test_script": "Blue."},
    ) as stream:
        events = list(stream)
    start = next(e for e in events if e.type == "message_start").message.usage
    delta = next(e for e in events if e.type == "message_delta").usage
    assert (start.cache_read_input_tokens or 0) > 0
    assert start.input_tokens == delta.input_tokens
    assert start.cache_read_input_tokens == delta.cache_read_input_tokens


def test_cache_control_blocks_and_beta_headers_are_tolerated(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model="tiny",
        max_tokens=16,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
        metadata={"user_id": "someone"},
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31,interleaved-thinking"},
        extra_body={"test_script": "Hello."},
    )
    assert msg.content[0].text == "Hello."  # type: ignore[union-attr]


def test_head_and_get_root_answer_200(server: Any) -> None:
    assert httpx.head(server.base_url + "/", timeout=10).status_code == 200
    root = httpx.get(server.base_url + "/", timeout=10)
    assert root.status_code == 200 and root.json()["name"] == "mlxcore"
