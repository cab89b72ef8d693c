"""Request normalisation and validation for the OpenAI front end."""

from __future__ import annotations

from typing import Any

import pytest

from mlxcore.builtin.openai import convert
from mlxcore.builtin.openai.convert import normalize_chat
from mlxcore.builtin.openai.schemas import ChatCompletionRequest, Message
from mlxcore.engine.validation import RequestRejected, check_stops
from mlxcore.request_builder import generation_budget
from mlxcore.server.errors import APIError


def normalize_text_chat(messages: list[Message]) -> list[dict[str, Any]]:
    """The template messages for a text-only model (no media handler)."""
    return normalize_chat(messages, None)[0]


def msgs(*pairs: tuple[str, object]) -> list[Message]:
    return [Message(role=r, content=c) for r, c in pairs]  # type: ignore[arg-type]


def test_developer_becomes_system_and_leading_systems_are_merged() -> None:
    out = normalize_text_chat(
        msgs(("developer", "be brief"), ("system", "no emojis"), ("user", "hi"))
    )
    assert out == [
        {"role": "system", "content": "be brief\n\nno emojis"},
        {"role": "user", "content": "hi"},
    ]


def test_later_systems_and_consecutive_users_stay_where_they_were_sent() -> None:
    """The history renders the same next turn (mlxcore.prompts rearranges only for a
    template that refuses this order)."""
    parts = [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]
    out = normalize_text_chat(
        msgs(("user", "first"), ("user", parts), ("system", "reminder"), ("user", "last"))
    )
    assert out == [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "part one\npart two"},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": "last"},
    ]


def test_tool_call_arguments_become_mappings_for_templates() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    out = normalize_text_chat(
        [
            Message(role="user", content="q"),
            Message(role="assistant", content=None, tool_calls=[call]),
            Message(role="tool", content="42", tool_call_id="c1"),
        ]
    )
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert out[2] == {"role": "tool", "content": "42", "tool_call_id": "c1"}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        (msgs(("wizard", "x")), "messages[0].role"),
        (
            msgs(("user", [{"type": "image_url", "image_url": {"url": "x"}}])),
            "messages[0].content[0].type",
        ),
    ],
)
def test_bad_messages_name_the_field(messages: list[Message], param: str) -> None:
    with pytest.raises(APIError) as err:
        normalize_text_chat(messages)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 3.0),
        ("top_p", 0.0),
        ("top_k", -5),
        ("n", 0),
        ("presence_penalty", 9.0),
        ("logit_bias", {"abc": 1.0}),
        ("logit_bias", {"99999999": 1.0}),
        ("seed", 2**70),
    ],
)
def test_sampling_values_out_of_range_name_the_field(field: str, value: object) -> None:
    body = ChatCompletionRequest(messages=msgs(("user", "x")), **{field: value})  # type: ignore[arg-type]
    with pytest.raises(APIError) as err:
        convert.sampling_params(body, vocab_size=1000, logprobs=False, top_logprobs=0)
    assert err.value.param == field


def test_sampling_defaults_follow_openai() -> None:
    body = ChatCompletionRequest(messages=msgs(("user", "x")), seed=-1, logit_bias={"5": -100})
    params = convert.sampling_params(body, vocab_size=1000, logprobs=True, top_logprobs=2)
    assert params.temperature == 1.0 and params.top_p == 1.0
    assert params.seed == 2**64 - 1
    assert params.logit_bias == {5: -100.0}
    assert params.logprobs and params.top_logprobs == 2


def test_max_tokens_and_stops() -> None:
    assert generation_budget(None, 512, 100) == 100
    with pytest.raises(RequestRejected):
        generation_budget(0, 512, None)
    with pytest.raises(RequestRejected):
        generation_budget(10**30, 512, 4096)
    assert convert.stop_list("x") == ["x"]
    assert check_stops(["a", ""]) == ["a"]
    with pytest.raises(RequestRejected, match="at most 16"):
        check_stops(["s"] * 17, "stop_sequences")
