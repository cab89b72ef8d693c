"""The gemma4 plugin: tool-call and thought-channel parsers, with the real Gemma 4 tokens.

Cases are checked by the conformance kit (whole, by character, random pieces,
token by token with the Gemma 4 test tokenizer where ``<|tool_call>``, ``<|"|>``
and ``<|channel>`` are single special tokens); the official template's own
rendering of tool calls is parsed back; auto-detection uses the real test model.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from mlx_lm.tool_parsers import gemma4 as mlx_gemma4

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
from mlxcore_gemma4 import Gemma4ReasoningParser, Gemma4ToolParser
from mlxcore_gemma4.values import parse_calls

Q = '<|"|>'
THOUGHT = "<|channel>thought\n"


def call(name: str, body: str) -> str:
    """One Gemma 4 tool call block: ``<|tool_call>call:NAME{BODY}<tool_call|>``."""
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


TOOLS = [
    *DEFAULT_TOOLS,
    tool(
        "google:mcp:create",
        "Create a document.",
        title={"type": "string"},
        body={"type": "object"},
        tags={"type": "array"},
        draft={"type": "boolean"},
        size={"type": "number"},
    ),
]
WEATHER = ("get_weather", {"city": "Paris", "days": 3})
SEARCH = ("search", {"limit": 5, "query": "Rome hotels"})
# google-gemma-4-31B-it.jinja renders the calls first, then the content.
OFFICIAL_TWO_CALLS = (
    f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>"
    f"<|tool_call>call:search{{limit:5,query:{Q}Rome hotels{Q}}}<tool_call|>Let me check."
)
NESTED = (
    f"<|tool_call>call:google:mcp:create{{body:{{sections:[{{heading:{Q}Intro{Q},"
    f"lines:[1,2.5,-3]}}],meta:{{ok:true,none:null}}}},draft:false,size:1e3,"
    f'tags:[{Q}a, b{Q},{Q}c}}{Q}],title:{Q}Say "hi": {{x,y}}\nline 2{Q}}}<tool_call|>'
)
NESTED_ARGS = {
    "body": {
        "sections": [{"heading": "Intro", "lines": [1, 2.5, -3]}],
        "meta": {"ok": True, "none": None},
    },
    "draft": False,
    "size": 1000.0,
    "tags": ["a, b", "c}"],
    "title": 'Say "hi": {x,y}\nline 2',
}


@pytest.fixture(scope="session")
def gemma4_tokenizer() -> Any:
    """The Gemma 4 test tokenizer (Gemma 3 vocabulary + the Gemma 4 special tokens)."""
    return loaded_test_model("gemma4_text").tokenizer


class TestGemma4ToolConformance(ParserConformance):
    parser_class = Gemma4ToolParser
    tokenizer_fixture = "gemma4_tokenizer"
    TOOLS = TOOLS
    MARKERS = ("<|tool_call>", "<tool_call|>", "<|tool_response>", "<|turn>", Q, "call:")
    CASES = [
        Case(
            "official-two-calls",
            OFFICIAL_TWO_CALLS,
            content="Let me check.",
            calls=[WEATHER, SEARCH],
        ),
        Case("namespaced-nested-values", NESTED, calls=[("google:mcp:create", NESTED_ARGS)]),
        Case(
            "calls-on-separate-lines-with-text-before",
            'Checking both.\n<|tool_call>call:search{query:<|"|>a<|"|>}<tool_call|>\n'
            '<|tool_call>call:search{query:<|"|>b<|"|>}<tool_call|>\n',
            content="Checking both.",
            calls=[("search", {"query": "a"}), ("search", {"query": "b"})],
        ),
        Case("empty-arguments", "<|tool_call>call:search{}<tool_call|>", calls=[("search", {})]),
        Case(
            "quoted-keys-json-strings-spaces-trailing-comma",
            f'<|tool_call>call:get_weather{{ {Q}city{Q} : "Nice" , "days": 2, }}<tool_call|>',
            calls=[("get_weather", {"city": "Nice", "days": 2})],
        ),
        Case(
            "string-typed-by-schema",
            f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q},days:{Q}4{Q}}}<tool_call|>",
            calls=[("get_weather", {"city": "Oslo", "days": 4})],
        ),
        Case(
            "bare-word-value-is-a-string",
            "<|tool_call>call:get_weather{city:Lyon,unit:celsius}<tool_call|>",
            calls=[("get_weather", {"city": "Lyon", "unit": "celsius"})],
        ),
        Case(
            "truncated-mid-string",
            f"Sure.<|tool_call>call:get_weather{{city:{Q}Par",
            content=f"Sure.<|tool_call>call:get_weather{{city:{Q}Par",
        ),
        Case(
            "truncated-after-complete-args-without-closer",
            f"<|tool_call>call:get_weather{{city:{Q}Rome{Q}}}",
            calls=[("get_weather", {"city": "Rome"})],
        ),
        Case(
            "malformed-returned-as-content",
            f"<|tool_call>call:get_weather{{city:{Q}Rome{Q}<tool_call|>after",
            content=f"<|tool_call>call:get_weather{{city:{Q}Rome{Q}<tool_call|>after",
        ),
        Case(
            "orphan-closer-and-turn-markers-dropped",
            "<|turn>Done.<tool_call|><turn|>",
            content="Done.",
        ),
        Case("stray-string-delimiter-dropped", f"say {Q}hi{Q}", content="say hi"),
        Case(
            "made-up-tool-response-dropped",
            f"<|tool_call>call:search{{query:{Q}x{Q}}}<tool_call|><|tool_response>"
            f"response:search{{value:{Q}fake{Q}}}<tool_response|>The answer.",
            content="The answer.",
            calls=[("search", {"query": "x"})],
        ),
        Case(
            "thought-channel-without-reasoning-parser-dropped",
            "<|channel>thought\nhmm<channel|>Hi",
            content="Hi",
        ),
        Case(
            "degraded-bare-call-with-orphan-closer",
            f"call:get_weather{{city:{Q}Bern{Q}}}<tool_call|>",
            calls=[("get_weather", {"city": "Bern"})],
        ),
        Case(
            "degraded-bare-call-unknown-tool",
            f"call:launch{{target:{Q}moon{Q}}}",
            content="call:launch{target:moon}",
        ),
        Case(
            "bare-call-mid-line-is-text",
            "I will call:search{} now",
            content="I will call:search{} now",
        ),
        Case(
            "degraded-calling-tool",
            '[Calling tool: search({"query": "q"})]',
            calls=[("search", {"query": "q"})],
        ),
        Case(
            "unicode-values-and-text-around",
            "Voilà 🌍 " + call("get_weather", f"city:{Q}東京 — Zürich{Q},days:2") + " Fin ✓",
            content="Voilà 🌍 Fin ✓",
            calls=[("get_weather", {"city": "東京 — Zürich", "days": 2})],
        ),
        Case(
            "quotes-braces-colons-in-string",
            call("search", f"query:{Q}say \"hi\" {{x}} [y] 'z' : , {Q}"),
            calls=[("search", {"query": "say \"hi\" {x} [y] 'z' : , "})],
        ),
        Case(
            "brackets-only-string",
            call("search", f"query:{Q}{{{{[{Q}"),
            calls=[("search", {"query": "{{["})],
        ),
        Case(
            "three-calls",
            call("search", f"query:{Q}a{Q}")
            + call("search", f"query:{Q}b{Q}")
            + call("get_weather", f"city:{Q}c{Q}"),
            calls=[
                ("search", {"query": "a"}),
                ("search", {"query": "b"}),
                ("get_weather", {"city": "c"}),
            ],
        ),
        Case(
            "text-between-calls",
            call("search", f"query:{Q}a{Q}") + "\nand then\n" + call("search", f"query:{Q}b{Q}"),
            content="and then",
            calls=[("search", {"query": "a"}), ("search", {"query": "b"})],
        ),
        Case(
            "negative-float-exponent",
            call("search", "limit:-2.5e-1"),
            calls=[("search", {"limit": -0.25})],
        ),
        Case(
            "null-and-boolean-values",
            call("google:mcp:create", "draft:true,title:null"),
            calls=[("google:mcp:create", {"draft": True, "title": None})],
        ),
        Case(
            "empty-string-value", call("search", f"query:{Q}{Q}"), calls=[("search", {"query": ""})]
        ),
        Case(
            "empty-object-and-array",
            call("google:mcp:create", "body:{},tags:[]"),
            calls=[("google:mcp:create", {"body": {}, "tags": []})],
        ),
        Case(
            "newline-inside-string",
            call("search", f"query:{Q}line1\nline2{Q}"),
            calls=[("search", {"query": "line1\nline2"})],
        ),
        Case("undeclared-tool-still-a-call", call("other", "n:5"), calls=[("other", {"n": 5})]),
        Case(
            "unicode-tool-and-key-names",
            call("météo", f"ville:{Q}Paris{Q}"),
            calls=[("météo", {"ville": "Paris"})],
        ),
        Case("turn-end-after-call-dropped", call("search", "") + "<turn|>", calls=[("search", {})]),
        Case(
            "no-call-colons-and-braces",
            "Note: call me at 5:30 {ok}.",
            content="Note: call me at 5:30 {ok}.",
        ),
        Case("truncated-after-opener", "Sure.<|tool_call>", content="Sure.<|tool_call>"),
        Case(
            "truncated-in-name",
            "Sure.<|tool_call>call:get_wea",
            content="Sure.<|tool_call>call:get_wea",
        ),
        Case(
            "malformed-bare-value-then-closer",
            "<|tool_call>call:search{query:1<tool_call|>tail",
            content="<|tool_call>call:search{query:1<tool_call|>tail",
        ),
        Case(
            "malformed-without-call-prefix",
            "<|tool_call>search{}<tool_call|>",
            content="<|tool_call>search{}<tool_call|>",
        ),
        Case(
            "degraded-bare-call-at-line-start-after-text",
            f"Sure.\ncall:search{{query:{Q}q{Q}}}",
            content="Sure.",
            calls=[("search", {"query": "q"})],
        ),
    ]


class TestGemma4ReasoningConformance(ParserConformance):
    parser_class = Gemma4ReasoningParser
    tokenizer_fixture = "gemma4_tokenizer"
    MARKERS = ("<|channel>", "<channel|>", "<|turn>", "<|think|>")
    PROMPTS = [
        ("<|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>", False),
        ("<|turn>system\n<|think|><turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n", False),
        ("<|turn>model\n<|channel>thought\n", True),
        ("<|turn>model\n<|channel>", True),
    ]
    CASES = [
        Case(
            "thought-then-answer",
            "<|channel>thought\nThe user says hi.\n<channel|>Hello!",
            content="Hello!",
            reasoning="The user says hi.",
        ),
        Case("thinking-off-plain-answer", "Hello there.", content="Hello there."),
        Case(
            "unclosed-thought-is-reasoning", "<|channel>thought\nhalf a tho", reasoning="half a tho"
        ),
        Case(
            "thought-then-tool-call-passed-on",
            "<|channel>thought\nNeed weather.<channel|>"
            f"<|tool_call>call:get_weather{{city:{Q}X{Q}}}<tool_call|>",
            content=f"<|tool_call>call:get_weather{{city:{Q}X{Q}}}<tool_call|>",
            reasoning="Need weather.",
        ),
        Case(
            "tool-call-ends-unclosed-thought",
            "<|channel>thought\nNeed weather.<|tool_call>call:search{}<tool_call|>",
            content="<|tool_call>call:search{}<tool_call|>",
            reasoning="Need weather.",
        ),
        Case("content-channel", "<|channel>content\nVisible.<channel|>", content="Visible."),
        Case(
            "unlabelled-channel-is-reasoning",
            "<|channel>Let me think<channel|>ok",
            content="ok",
            reasoning="Let me think",
        ),
        Case(
            "control-markers-dropped",
            "<|think|><|channel>thought\na<|turn>b<channel|>c<turn|>",
            content="c",
            reasoning="ab",
        ),
        Case(
            "prompt-opened-channel",
            "plan\n<channel|>answer",
            content="answer",
            reasoning="plan",
            starts_in_reasoning=True,
        ),
        Case(
            "unicode-reasoning-and-answer",
            f"{THOUGHT}Le café ☕ 3 €; 日本語.<channel|>Réponse ✓",
            content="Réponse ✓",
            reasoning="Le café ☕ 3 €; 日本語.",
        ),
        Case(
            "quotes-and-braces-in-reasoning",
            f'{THOUGHT}JSON {{"a": "b"}} and [1, 2].<channel|>Done.',
            content="Done.",
            reasoning='JSON {"a": "b"} and [1, 2].',
        ),
        Case(
            "thought-then-two-calls-passed-on",
            f"{THOUGHT}Two lookups.<channel|><|tool_call>call:search{{query:{Q}a{Q}}}<tool_call|>"
            "<|tool_call>call:search{}<tool_call|>",
            content=f"<|tool_call>call:search{{query:{Q}a{Q}}}<tool_call|>"
            "<|tool_call>call:search{}<tool_call|>",
            reasoning="Two lookups.",
        ),
        Case("empty-thought", f"{THOUGHT}<channel|>Answer", content="Answer"),
        Case("empty-thought-no-newline", "<|channel>thought<channel|>Answer", content="Answer"),
        Case(
            "text-before-and-after-thought",
            f"Hmm. {THOUGHT}inner<channel|> after",
            content="Hmm. after",
            reasoning="inner",
        ),
        Case(
            "angle-brackets-in-answer",
            f"{THOUGHT}x<channel|>Use a < b and <b>bold</b>.",
            content="Use a < b and <b>bold</b>.",
            reasoning="x",
        ),
        Case("truncated-channel-marker-is-content", "Answer <|chan", content="Answer <|chan"),
        Case("no-output", ""),
        Case("prompt-opened-no-output", "", starts_in_reasoning=True),
        Case(
            "prompt-opened-then-call",
            "Need data.<|tool_call>call:search{}<tool_call|>",
            content="<|tool_call>call:search{}<tool_call|>",
            reasoning="Need data.",
            starts_in_reasoning=True,
        ),
        Case(
            "prompt-opened-never-closed",
            "still thinking",
            reasoning="still thinking",
            starts_in_reasoning=True,
        ),
        Case(
            "prompt-opened-close-at-once",
            "<channel|>Answer",
            content="Answer",
            starts_in_reasoning=True,
        ),
        Case(
            "multi-line-thought",
            f"{THOUGHT}step 1\n\nstep 2\n<channel|>\nanswer",
            content="answer",
            reasoning="step 1\n\nstep 2",
        ),
        Case("stray-close-dropped", "a<channel|>b", content="ab"),
        Case(
            "turn-end-after-answer-dropped",
            f"{THOUGHT}r<channel|>Answer<turn|>",
            content="Answer",
            reasoning="r",
        ),
        Case(
            "two-thoughts",
            f"{THOUGHT}a<channel|>mid{THOUGHT}b<channel|>end",
            content="midend",
            reasoning="ab",
        ),
        Case(
            "think-token-then-thought",
            f"<|think|>{THOUGHT}x<channel|>y",
            content="y",
            reasoning="x",
        ),
        Case(
            "thought-then-content-channel",
            f"{THOUGHT}r<channel|><|channel>content\nVisible.<channel|>",
            content="Visible.",
            reasoning="r",
        ),
        Case("emoji", f"{THOUGHT}🎉🎉<channel|>🎉", content="🎉", reasoning="🎉🎉"),
        Case("final-channel-is-content", "<|channel>final\nVisible.<channel|>", content="Visible."),
    ]


def test_official_template_renders_what_the_cases_use() -> None:
    template = find_chat_template("google-gemma-4-31B-it.jinja")
    assert template is not None
    calls = [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in (WEATHER, SEARCH)
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris, hotels in Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": calls},
    ]
    rendered = render_chat(template, messages, tools=TOOLS)
    assert last_turn(rendered, "<|turn>model\n", "<turn|>") == OFFICIAL_TWO_CALLS


def test_official_rendering_of_every_value_type_round_trips() -> None:
    template = find_chat_template("google-gemma-4-31B-it.jinja")
    assert template is not None
    calls = [{"function": {"name": "google:mcp:create", "arguments": NESTED_ARGS}}]
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": calls}]
    turn = last_turn(render_chat(template, messages, tools=TOOLS), "<|turn>model\n", "<turn|>")
    (call,) = Gemma4ToolParser(TOOLS).parse(turn).tool_calls
    assert call.name == "google:mcp:create" and json.loads(call.arguments) == NESTED_ARGS


def test_values_agree_with_mlx_lm_where_it_applies() -> None:
    """mlx-lm's non-streaming parser (no namespaced names) as an independent oracle."""
    body = f"call:search{{limit:5,query:{Q}a, b {{c}}{Q},opts:{{deep:[true,null,-1.5]}}}}"
    theirs = mlx_gemma4.parse_tool_call(body)
    assert parse_calls(body) == [(theirs["name"], theirs["arguments"])]


@pytest.mark.parametrize(
    "body",
    [
        "call:f{a:1",
        "call:f{a:}",
        "call:{a:1}",
        "call:f{a:1}}",
        "call:f[1]",
        "call f{a:1}",
        f"call:f{{a:{Q}x}}",
    ],
)
def test_malformed_bodies_are_rejected(body: str) -> None:
    assert parse_calls(body) is None


def test_thinking_and_calls_through_the_pipeline_with_real_tokens() -> None:
    output = (
        "<|channel>thought\nThe user wants the weather.\n<channel|>"
        f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>"
        f"<|tool_call>call:google:mcp:create{{title:{Q}Trip{Q}}}<tool_call|><|tool_response>"
    )
    delta = run_pipeline(
        output,
        loaded_test_model("gemma4_text").tokenizer,
        reasoning=Gemma4ReasoningParser(),
        tools=Gemma4ToolParser(TOOLS),
    )
    assert delta.reasoning == "The user wants the weather."
    assert delta.content == ""
    calls = [(c.name, json.loads(c.arguments)) for c in delta.tool_calls]
    assert calls == [WEATHER, ("google:mcp:create", {"title": "Trip"})]
    assert delta.finish_reason == "tool_calls"


def test_auto_detects_gemma4_from_the_real_test_model() -> None:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(autoload=True))
    info = loaded_test_model("gemma4_text").info
    chosen = Parsers.select(PluginHooks(pm), info, "auto", "auto")
    assert chosen.tool is Gemma4ToolParser and chosen.reasoning is Gemma4ReasoningParser
    assert Gemma4ToolParser.matches(info) and Gemma4ReasoningParser.matches(info)
    qwen = loaded_test_model("qwen3").info
    assert not Gemma4ToolParser.matches(qwen) and not Gemma4ReasoningParser.matches(qwen)


def test_detection_by_vocabulary_alone() -> None:
    info = loaded_test_model("gemma4_text").info
    no_template = attrs.evolve(info, chat_template=None)
    assert Gemma4ToolParser.matches(no_template) and Gemma4ReasoningParser.matches(no_template)


def test_control_tokens_are_declared_and_are_single_tokens() -> None:
    """``control_tokens`` lets the pipeline hide them by id when no parser instance runs."""
    info = loaded_test_model("gemma4_text").info
    assert Gemma4ToolParser.control_tokens == Gemma4ReasoningParser.control_tokens
    assert {"<|turn>", "<turn|>", "<|think|>"} <= set(Gemma4ToolParser.control_tokens)
    assert all(info.has_token(t) for t in Gemma4ToolParser.control_tokens)
