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


def invoke(name: str, *params: tuple[str, str]) -> str:
    """One ``<invoke>`` as the official template writes it."""
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params)
    return f'<invoke name="{name}">\n{body}</invoke>\n'


def block(*invokes: str) -> str:
    """A ``<minimax:tool_call>`` block around ``invokes``."""
    return "<minimax:tool_call>\n" + "".join(invokes) + "</minimax:tool_call>"


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
        Case(
            "single-call",
            block(invoke("get_weather", ("city", "Paris"))),
            calls=[("get_weather", {"city": "Paris"})],
        ),
        Case(
            "unicode-values-and-text-around",
            "Voilà 🌍\n"
            + block(invoke("get_weather", ("city", "東京 — Zürich"), ("days", "2")))
            + "\nFin ✓",
            content="Voilà 🌍\nFin ✓",
            calls=[("get_weather", {"city": "東京 — Zürich", "days": 2})],
        ),
        Case(
            "quotes-braces-and-tags-in-value",
            block(invoke("search", ("query", "say \"hi\" {x} [y] 'z' <b>"))),
            calls=[("search", {"query": "say \"hi\" {x} [y] 'z' <b>"})],
        ),
        Case(
            "markup-like-text-in-value",
            block(invoke("search", ("query", "<div>a</div> x < y </param> b"))),
            calls=[("search", {"query": "<div>a</div> x < y </param> b"})],
        ),
        Case("empty-arguments", block(invoke("search")), calls=[("search", {})]),
        Case(
            "three-invokes-in-one-block",
            block(
                invoke("search", ("query", "a")),
                invoke("search", ("query", "b")),
                invoke("get_weather", ("city", "c")),
            ),
            calls=[
                ("search", {"query": "a"}),
                ("search", {"query": "b"}),
                ("get_weather", {"city": "c"}),
            ],
        ),
        Case(
            "text-between-two-blocks",
            block(invoke("search", ("query", "a")))
            + "\nthen\n"
            + block(invoke("search", ("query", "b"))),
            content="then",
            calls=[("search", {"query": "a"}), ("search", {"query": "b"})],
        ),
        Case(
            "multi-line-value",
            block(invoke("search", ("query", "line 1\n\nline 2"))),
            calls=[("search", {"query": "line 1\n\nline 2"})],
        ),
        Case(
            "json-text-for-a-string-stays-text",
            block(invoke("search", ("query", '{"a": 1}'))),
            calls=[("search", {"query": '{"a": 1}'})],
        ),
        Case(
            "number-for-a-string-and-enum",
            block(invoke("get_weather", ("city", "1984"), ("unit", "celsius"))),
            calls=[("get_weather", {"city": "1984", "unit": "celsius"})],
        ),
        Case(
            "values-that-do-not-fit-stay-text",
            block(invoke("typed", ("i", "4.5"), ("b", "maybe"), ("s", "null"))),
            calls=[("typed", {"i": "4.5", "b": "maybe", "s": "null"})],
        ),
        Case(
            "emoji-value",
            block(invoke("search", ("query", "🎉🎉"))),
            calls=[("search", {"query": "🎉🎉"})],
        ),
        Case(
            "truncated-after-opener",
            "Sure.\n<minimax:tool_call>",
            content="Sure.\n<minimax:tool_call>",
        ),
        Case(
            "truncated-in-invoke-name",
            'Sure.\n<minimax:tool_call>\n<invoke name="get_wea',
            content='Sure.\n<minimax:tool_call>\n<invoke name="get_wea',
        ),
        Case(
            "malformed-invoke-without-name",
            "<minimax:tool_call>\n<invoke>\n</invoke>\n</minimax:tool_call>",
            content="<minimax:tool_call>\n<invoke>\n</invoke>\n</minimax:tool_call>",
        ),
        Case(
            "no-call-angle-text",
            "Use x < y and <invoke> as a word.",
            content="Use x < y and <invoke> as a word.",
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
        Case(
            "unicode-reasoning-and-answer",
            "Le café ☕ 3 €; 日本語.\n</think>\n\nRéponse ✓",
            content="Réponse ✓",
            reasoning="Le café ☕ 3 €; 日本語.",
            starts_in_reasoning=True,
        ),
        Case(
            "quotes-and-braces-in-reasoning",
            'JSON {"a": "b"} and [1, 2].\n</think>\n\nDone.',
            content="Done.",
            reasoning='JSON {"a": "b"} and [1, 2].',
            starts_in_reasoning=True,
        ),
        Case(
            "reasoning-then-full-call-block",
            "Need it.\n</think>\n\n" + block(invoke("search", ("query", "q"))),
            content=block(invoke("search", ("query", "q"))),
            reasoning="Need it.",
            starts_in_reasoning=True,
        ),
        Case(
            "reasoning-text-then-official-two-calls",
            "I will look both up.\n</think>\n\n" + OFFICIAL_TWO_CALLS,
            content=OFFICIAL_TWO_CALLS,
            reasoning="I will look both up.",
            starts_in_reasoning=True,
        ),
        Case(
            "empty-reasoning",
            "\n</think>\n\nAnswer",
            content="Answer",
            starts_in_reasoning=True,
        ),
        Case(
            "model-opens-think",
            "<think>\nplan\n</think>\n\nAnswer",
            content="Answer",
            reasoning="plan",
        ),
        Case(
            "model-opens-think-again-after-prompt",
            "<think>\nplan\n</think>\n\nAnswer",
            content="Answer",
            reasoning="plan",
            starts_in_reasoning=True,
        ),
        Case(
            "multi-line-reasoning",
            "step 1\n\nstep 2\n</think>\nanswer",
            content="answer",
            reasoning="step 1\n\nstep 2",
            starts_in_reasoning=True,
        ),
        Case("stray-close-without-open-dropped", "a</think>b", content="ab"),
        Case("no-output", "", starts_in_reasoning=True),
        Case("no-output-thinking-off", ""),
        Case(
            "angle-brackets-in-answer",
            "r\n</think>\n\nUse a < b and <b>bold</b>.",
            content="Use a < b and <b>bold</b>.",
            reasoning="r",
            starts_in_reasoning=True,
        ),
        Case(
            "truncated-close-tag-stays-reasoning",
            "thinking </thi",
            reasoning="thinking </thi",
            starts_in_reasoning=True,
        ),
        Case("truncated-open-tag-is-content", "Answer <thi", content="Answer <thi"),
        Case(
            "emoji",
            "🎉🎉</think>🎉",
            content="🎉",
            reasoning="🎉🎉",
            starts_in_reasoning=True,
        ),
        Case(
            "second-think-block",
            "a</think>mid<think>b</think>end",
            content="midend",
            reasoning="ab",
            starts_in_reasoning=True,
        ),
        Case(
            "trailing-newlines-of-answer-kept",
            "r\n</think>\n\n\nAnswer\n\n",
            content="Answer\n\n",
            reasoning="r",
            starts_in_reasoning=True,
        ),
        Case(
            "crlf-line-ends",
            "r\r\n</think>\r\n\r\nAnswer",
            content="Answer",
            reasoning="r",
            starts_in_reasoning=True,
        ),
        Case(
            "unwrapped-invoke-mid-line-stays-reasoning",
            'Plan <invoke name="search"></invoke>',
            reasoning='Plan <invoke name="search"></invoke>',
            starts_in_reasoning=True,
        ),
        Case(
            "qwen-call-in-reasoning-stays-reasoning",
            "Plan\n<tool_call>\n{}\n</tool_call>",
            reasoning="Plan\n<tool_call>\n{}\n</tool_call>",
            starts_in_reasoning=True,
        ),
        Case(
            "think-block-after-answer-text",
            "Hmm. <think>inner</think> after",
            content="Hmm. after",
            reasoning="inner",
        ),
        Case(
            "close-then-call-on-the-same-line",
            "plan</think>" + block(invoke("search")),
            content=block(invoke("search")),
            reasoning="plan",
            starts_in_reasoning=True,
        ),
        Case(
            "braces-and-quotes-with-thinking-off",
            'Answer with braces {} and quotes "x".',
            content='Answer with braces {} and quotes "x".',
        ),
        Case(
            "unicode-reasoning-never-closed",
            "思考中… ☕",
            reasoning="思考中… ☕",
            starts_in_reasoning=True,
        ),
        Case(
            "call-ends-unclosed-reasoning-with-arguments",
            "Let me search." + block(invoke("search", ("query", "q"))),
            content=block(invoke("search", ("query", "q"))),
            reasoning="Let me search.",
            starts_in_reasoning=True,
        ),
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
