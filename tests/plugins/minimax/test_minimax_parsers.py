"""The minimax plugin: ``<minimax:tool_call>`` / ``<invoke>`` calls and prompt-opened ``<think>``.

No real MiniMax-M2 tokenizer is available here, so token-by-token checks use the
Qwen3 tokenizer (the MiniMax markup is then split into many tokens: a harder
stream than the real one, where ``<minimax:tool_call>`` is a single token).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

import mlxcore.testing
from mlxcore.hooks import PluginHooks
from mlxcore.parsers.selection import Parsers
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.testing.conformance import (
    DEFAULT_TOOLS,
    Case,
    ParserConformance,
    find_chat_template,
    last_turn,
    loaded_test_model,
    render_chat,
    run_pipeline,
    tool,
)
from mlxcore_minimax import MiniMaxM2ReasoningParser, MiniMaxM2ToolParser

SHARED_TEMPLATES = Path(mlxcore.testing.__file__).parent / "assets" / "chat-templates"
TOOLS = [
    *DEFAULT_TOOLS,
    tool(
        "typed",
        i={"type": "integer"},
        n={"type": "number"},
        b={"type": "boolean"},
        z={"type": ["string", "null"]},
        arr={"type": "array"},
        obj={"type": "object"},
        u={"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
        s={"type": "string"},
    ),
]
WEATHER = ("get_weather", {"city": "Paris", "days": 3})
SEARCH = ("search", {"query": "Rome hotels", "limit": 5})
# MiniMax-M2.jinja's rendering of an assistant turn with two tool calls.
OFFICIAL_TWO_CALLS = (
    "Let me check.\n<minimax:tool_call>\n"
    '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
    '<parameter name="days">3</parameter>\n</invoke>\n'
    '<invoke name="search">\n<parameter name="query">Rome hotels</parameter>\n'
    '<parameter name="limit">5</parameter>\n</invoke>\n</minimax:tool_call>'
)
TYPED_CALL = (
    '<minimax:tool_call>\n<invoke name="typed">\n'
    '<parameter name="i">-12</parameter>\n<parameter name="n">0.5</parameter>\n'
    '<parameter name="b">true</parameter>\n<parameter name="z">null</parameter>\n'
    '<parameter name="arr">[1, "two", null]</parameter>\n'
    '<parameter name="obj">{"k": {"deep": false}}</parameter>\n'
    '<parameter name="u">false</parameter>\n<parameter name="s">  keep\n  this  </parameter>\n'
    "</invoke>\n</minimax:tool_call>"
)
TYPED_ARGS = {
    "i": -12,
    "n": 0.5,
    "b": True,
    "z": None,
    "arr": [1, "two", None],
    "obj": {"k": {"deep": False}},
    "u": False,
    "s": "  keep\n  this  ",
}


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    return loaded_test_model("qwen3").tokenizer


class TestMiniMaxToolConformance(ParserConformance):
    parser_class = MiniMaxM2ToolParser
    tokenizer_fixture = "qwen3_tokenizer"
    TOOLS = TOOLS
    MARKERS = ("<minimax:tool_call>", "</minimax:tool_call>", "<invoke name=", "<tool_call>")
    CASES = [
        Case(
            "official-two-calls",
            OFFICIAL_TWO_CALLS,
            content="Let me check.",
            calls=[WEATHER, SEARCH],
        ),
        Case("every-schema-type", TYPED_CALL, calls=[("typed", TYPED_ARGS)]),
        Case(
            "quote-styles-and-spacing",
            "<minimax:tool_call><invoke name='get_weather'><parameter name = city>Oslo"
            '</parameter><parameter  name="days" >2</parameter></invoke></minimax:tool_call>',
            calls=[("get_weather", {"city": "Oslo", "days": 2})],
        ),
        Case(
            "missing-parameter-closer-inside-closed-block",
            '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Rome\n'
            '<parameter name="days">1</parameter>\n</invoke>\n</minimax:tool_call>',
            calls=[("get_weather", {"city": "Rome", "days": 1})],
        ),
        Case(
            "unknown-parameter-and-tool-stay-text",
            '<minimax:tool_call><invoke name="other"><parameter name="n">5</parameter>'
            "</invoke></minimax:tool_call>",
            calls=[("other", {"n": "5"})],
        ),
        Case(
            "truncated-mid-invoke",
            'Sure.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Pa',
            content='Sure.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
            '<parameter name="city">Pa',
        ),
        Case(
            "truncated-before-block-closer-strict",
            '<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">q</parameter>',
            content='<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">q'
            "</parameter>",
        ),
        Case(
            "complete-invoke-missing-block-closer",
            '<minimax:tool_call>\n<invoke name="search">\n<parameter name="query">q</parameter>'
            "\n</invoke>\n",
            calls=[("search", {"query": "q"})],
        ),
        Case(
            "malformed-block-is-content",
            "<minimax:tool_call>\nnot an invoke\n</minimax:tool_call>",
            content="<minimax:tool_call>\nnot an invoke\n</minimax:tool_call>",
        ),
        Case("stray-closer-dropped", "Done.\n</minimax:tool_call>", content="Done."),
        Case(
            "unwrapped-invoke-known-tool",
            'Ok.\n<invoke name="search">\n<parameter name="query">x</parameter>\n</invoke>',
            content="Ok.",
            calls=[("search", {"query": "x"})],
        ),
        Case(
            "unwrapped-invoke-unknown-tool",
            '<invoke name="drop_db"><parameter name="x">1</parameter></invoke>',
            content='<invoke name="drop_db"><parameter name="x">1</parameter></invoke>',
        ),
        Case(
            "qwen-style-block-known-tool",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Kyiv", "days": "2"}}\n'
            "</tool_call>",
            calls=[("get_weather", {"city": "Kyiv", "days": 2})],
        ),
        Case(
            "qwen-style-block-unknown-tool",
            '<tool_call>{"name": "x", "arguments": {}}</tool_call>',
            content='<tool_call>{"name": "x", "arguments": {}}</tool_call>',
        ),
        Case(
            "degraded-calling-tool",
            '[Calling tool: search({"query": "mlx"})]',
            calls=[("search", {"query": "mlx"})],
        ),
    ]


class TestMiniMaxReasoningConformance(ParserConformance):
    parser_class = MiniMaxM2ReasoningParser
    tokenizer_fixture = "qwen3_tokenizer"
    MARKERS = ("<think>", "</think>")
    PROMPTS = [
        ("]~!b[]~b]system\nBe brief.[e~[\n]~b]user\nhi[e~[\n]~b]ai\n<think>\n", True),
        ("]~b]ai\n<think>\nold\n</think>\n\nhello[e~[\n]~b]user\nmore[e~[\n", False),
    ]
    CASES = [
        Case(
            "prompt-opened-think",
            "The user greets me.\n</think>\n\nHello!",
            content="Hello!",
            reasoning="The user greets me.",
            starts_in_reasoning=True,
        ),
        Case(
            "think-then-tool-call",
            "Need the weather.\n</think>\n\n<minimax:tool_call>\n</minimax:tool_call>",
            content="<minimax:tool_call>\n</minimax:tool_call>",
            reasoning="Need the weather.",
            starts_in_reasoning=True,
        ),
        Case(
            "tool-call-ends-unclosed-think",
            "Need the weather.<minimax:tool_call>x</minimax:tool_call>",
            content="<minimax:tool_call>x</minimax:tool_call>",
            reasoning="Need the weather.",
            starts_in_reasoning=True,
        ),
        Case(
            "truncated-think-is-reasoning",
            "still thinking",
            reasoning="still thinking",
            starts_in_reasoning=True,
        ),
        Case("thinking-off-is-content", "Hello.", content="Hello."),
    ]


def minimax_template() -> str:
    text = find_chat_template("MiniMax-M2.jinja", extra_dirs=[SHARED_TEMPLATES])
    if text is None:
        pytest.skip("MiniMax-M2.jinja not available")
    return text


def test_official_template_renders_what_the_cases_use() -> None:
    calls = [{"function": {"name": n, "arguments": a}} for n, a in (WEATHER, SEARCH)]
    messages = [
        {"role": "user", "content": "Weather in Paris, hotels in Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": calls},
    ]
    rendered = render_chat(minimax_template(), messages, tools=TOOLS)
    assert last_turn(rendered, "]~b]ai\n", "[e~[") == OFFICIAL_TWO_CALLS


def test_official_prompt_opens_thinking() -> None:
    messages = [{"role": "user", "content": "hi"}]
    prompt = render_chat(minimax_template(), messages, tools=TOOLS, add_generation_prompt=True)
    assert MiniMaxM2ReasoningParser.prompt_opens_reasoning(prompt)


def test_official_rendering_of_typed_arguments_round_trips() -> None:
    calls = [{"function": {"name": "typed", "arguments": TYPED_ARGS}}]
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": calls}]
    turn = last_turn(render_chat(minimax_template(), messages, tools=TOOLS), "]~b]ai\n", "[e~[")
    (call,) = MiniMaxM2ToolParser(TOOLS).parse(turn).tool_calls
    assert json.loads(call.arguments) == TYPED_ARGS


def test_thinking_and_calls_through_the_pipeline() -> None:
    output = "I will look both up.\n</think>\n\n" + OFFICIAL_TWO_CALLS
    delta = run_pipeline(
        output,
        loaded_test_model("qwen3").tokenizer,
        reasoning=MiniMaxM2ReasoningParser(starts_in_reasoning=True),
        tools=MiniMaxM2ToolParser(TOOLS),
    )
    assert delta.reasoning == "I will look both up."
    assert delta.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in delta.tool_calls] == [WEATHER, SEARCH]
    assert delta.finish_reason == "tool_calls"


def test_auto_detects_minimax_from_its_template() -> None:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=True))
    qwen3 = loaded_test_model("qwen3").info
    info = attrs.evolve(qwen3, chat_template=minimax_template())
    chosen = Parsers.select(PluginHooks(pm), info, "auto", "auto")
    assert chosen.tool is MiniMaxM2ToolParser and chosen.reasoning is MiniMaxM2ReasoningParser
    assert not MiniMaxM2ToolParser.matches(qwen3) and not MiniMaxM2ReasoningParser.matches(qwen3)


def test_detection_by_vocabulary_alone() -> None:
    qwen3 = loaded_test_model("qwen3").info
    vocab = {**qwen3.vocab, "<minimax:tool_call>": len(qwen3.vocab)}
    assert MiniMaxM2ToolParser.matches(attrs.evolve(qwen3, chat_template=None, vocab=vocab))
