"""The built-in parsers against what the official chat templates actually render.

A conversation with tool calls is rendered with each family's template; the
assistant turn is exactly what a model trained on that template writes, so the
parsers must turn it back into the same calls (streamed token by token through
the real output pipeline, too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import mlxcore.testing
from mlxcore.parsers.qwen import HermesToolParser, Qwen3CoderToolParser
from mlxcore.parsers.think import ThinkReasoningParser
from mlxcore.testing.conformance import (
    find_chat_template,
    last_turn,
    loaded_test_model,
    render_chat,
    run_pipeline,
)

SHARED_TEMPLATES = Path(mlxcore.testing.__file__).parent / "assets" / "chat-templates"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "typed",
            "parameters": {
                "type": "object",
                "properties": {
                    "i": {"type": "integer"},
                    "n": {"type": "number"},
                    "b": {"type": "boolean"},
                    "z": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "arr": {"type": "array", "items": {"type": "integer"}},
                    "obj": {"type": "object"},
                    "s": {"type": "string"},
                },
            },
        },
    },
]
TWO_CALLS = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("search", {"query": "Rome hotels", "limit": 5}),
]
TYPED_ARGS = {
    "i": 7,
    "n": 2.5,
    "b": False,
    "z": None,
    "arr": [3, 1],
    "obj": {"nested": {"list": [1, "two", None]}, "flag": True},
    "s": 'multi\nline  text with <tags> & "quotes"',
}
CHATML = ("<|im_start|>assistant\n", "<|im_end|>")


def template(name: str) -> str:
    text = find_chat_template(name, extra_dirs=[SHARED_TEMPLATES])
    if text is None:
        pytest.skip(f"chat template {name} not available")
    return text


def conversation(calls: list[tuple[str, dict[str, Any]]], content: str = "") -> list[dict]:
    return [
        {"role": "user", "content": "Weather in Paris, and hotels in Rome?"},
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(calls)
            ],
        },
    ]


def calls_of(delta: Any) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in delta.tool_calls]


@pytest.mark.parametrize(
    ("name", "parser", "reasoning"),
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", HermesToolParser, None),
        ("Qwen-Qwen3-0.6B.jinja", HermesToolParser, ThinkReasoningParser),
        ("Qwen3-Coder.jinja", Qwen3CoderToolParser, None),
        ("Qwen3.5-4B.jinja", Qwen3CoderToolParser, ThinkReasoningParser),
    ],
)
@pytest.mark.parametrize("content", ["", "Checking both."])
def test_rendered_calls_come_back_typed(name, parser, reasoning, content) -> None:
    """Three calls (one with every JSON type) rendered by the template, parsed back."""
    calls = [*TWO_CALLS, ("typed", TYPED_ARGS)]
    tpl = template(name)
    prompt = render_chat(tpl, conversation([])[:1], tools=TOOLS, add_generation_prompt=True)
    turn = last_turn(render_chat(tpl, conversation(calls, content), tools=TOOLS), *CHATML)
    opened = reasoning is not None and reasoning.prompt_opens_reasoning(prompt)
    output = turn[len("<think>\n") :] if opened else turn  # the prompt already wrote it
    tokenizer = loaded_test_model("qwen3").tokenizer
    reasoner = reasoning(starts_in_reasoning=opened) if reasoning else None
    delta = run_pipeline(output, tokenizer, reasoning=reasoner, tools=parser(TOOLS))
    assert calls_of(delta) == calls
    assert delta.content == content
    assert delta.reasoning == ""
    assert delta.finish_reason == "tool_calls"


def test_qwen3_5_prompt_opens_thinking_unless_disabled() -> None:
    tpl = template("Qwen3.5-4B.jinja")
    msgs = conversation([])[:1]
    on = render_chat(tpl, msgs, add_generation_prompt=True)
    off = render_chat(tpl, msgs, add_generation_prompt=True, enable_thinking=False)
    assert ThinkReasoningParser.prompt_opens_reasoning(on)
    assert not ThinkReasoningParser.prompt_opens_reasoning(off)


def test_qwen3_prompt_leaves_thinking_to_the_model() -> None:
    tpl = template("Qwen-Qwen3-0.6B.jinja")
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello"},
        {"role": "user", "content": "What does <think> mean?"},
    ]
    for kwargs in ({}, {"enable_thinking": False}):
        prompt = render_chat(tpl, history, add_generation_prompt=True, **kwargs)
        assert not ThinkReasoningParser.prompt_opens_reasoning(prompt)


def test_qwen3_5_thinking_then_call_through_the_pipeline() -> None:
    """Reasoning streamed, then an XML call, token by token with the real tokenizer."""
    output = (
        "The user wants weather.\nI will call the tool.\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
    )
    delta = run_pipeline(
        output,
        loaded_test_model("qwen3_5").tokenizer,
        reasoning=ThinkReasoningParser(starts_in_reasoning=True),
        tools=Qwen3CoderToolParser(TOOLS),
    )
    assert delta.reasoning == "The user wants weather.\nI will call the tool."
    assert delta.content == ""
    assert calls_of(delta) == [("get_weather", {"city": "Paris", "days": 2})]
    assert delta.finish_reason == "tool_calls"


def test_truncated_call_through_the_pipeline_is_content_with_length_reason() -> None:
    output = '<tool_call>\n{"name": "search", "arguments": {"query": "cut sh'
    delta = run_pipeline(
        output,
        loaded_test_model("qwen3").tokenizer,
        tools=HermesToolParser(TOOLS),
        engine_reason="length",
    )
    assert delta.content == output
    assert delta.tool_calls == []
    assert delta.finish_reason == "length"
