"""The built-in parsers (hermes, qwen3_coder, think) through the conformance kit.

Every case is checked parsed whole, by character, in random pieces and token by
token with the real Qwen3 tokenizer. The texts marked "official" are exactly
what the official chat templates render (checked in test_parsers_templates.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import mlxcore.testing
from mlxcore.parsers.qwen import HermesToolParser, Qwen3CoderToolParser
from mlxcore.parsers.think import ThinkReasoningParser
from mlxcore.testing.conformance import (
    DEFAULT_TOOLS,
    Case,
    ParserConformance,
    find_chat_template,
    last_turn,
    loaded_test_model,
    render_chat,
)

SHARED_TEMPLATES = Path(mlxcore.testing.__file__).parent / "assets" / "chat-templates"


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer (``<tool_call>``, ``<think>`` are single tokens)."""
    return loaded_test_model("qwen3").tokenizer


TYPED_TOOLS = [
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
                    "u": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "s": {"type": "string"},
                    "e": {"enum": ["a", "b"]},
                    "t": {"type": ["integer", "null"]},
                },
            },
        },
    }
]

WEATHER = "get_weather"
PARIS = {"city": "Paris", "days": 3}

# Official Qwen3 / Qwen2.5 renderings (Qwen-Qwen3-0.6B.jinja, Qwen-Qwen2.5-7B-Instruct.jinja).
HERMES_TWO_CALLS = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "search", "arguments": {"query": "Rome hotels", "limit": 5}}\n'
    "</tool_call>"
)
# Official Qwen3-Coder / Qwen3.5 rendering (Qwen3-Coder.jinja, Qwen3.5-4B.jinja).
XML_TWO_CALLS = (
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=search>\n<parameter=query>\nRome hotels\n</parameter>\n"
    "<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>"
)
TWO_CALLS = [(WEATHER, PARIS), ("search", {"query": "Rome hotels", "limit": 5})]


@pytest.mark.parametrize(
    ("name", "literal"),
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", HERMES_TWO_CALLS),
        ("Qwen3-Coder.jinja", XML_TWO_CALLS),
        ("Qwen3.5-4B.jinja", "<think>\n\n</think>\n\n" + XML_TWO_CALLS),
        ("Qwen-Qwen3-0.6B.jinja", "<think>\n\n</think>\n\n" + HERMES_TWO_CALLS),
    ],
)
def test_conformance_texts_are_the_official_renderings(name: str, literal: str) -> None:
    text = find_chat_template(name, extra_dirs=[SHARED_TEMPLATES])
    if text is None:
        pytest.skip(f"chat template {name} not available")
    calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in TWO_CALLS]
    messages = [
        {"role": "user", "content": "Weather in Paris, and hotels in Rome?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": calls},
    ]
    rendered = render_chat(text, messages, tools=list(DEFAULT_TOOLS))
    assert last_turn(rendered, "<|im_start|>assistant\n", "<|im_end|>") == literal


COMMON_CASES = [
    Case("plain", "Just an answer.", content="Just an answer."),
    Case(
        "truncated-mid-call",
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci',
        content='Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci',
    ),
    Case(
        "truncated-after-opener",
        "Sure.\n<tool_call>",
        content="Sure.\n<tool_call>",
    ),
    Case(
        "prefix-at-end-returned",
        "Look: <tool_ca",
        content="Look: <tool_ca",
    ),
    Case(
        "markup-mentioned-in-prose",
        "Wrap calls in <tool_call> tags.",
        content="Wrap calls in <tool_call> tags.",
    ),
    Case("stray-closer-dropped", "Done.\n</tool_call>", content="Done."),
    Case(
        "degraded-calling-tool",
        'Checking.\n[Calling tool: get_weather({"city": "Oslo"})]',
        content="Checking.",
        calls=[(WEATHER, {"city": "Oslo"})],
    ),
    Case(
        "degraded-calling-tool-unknown-name",
        '[Calling tool: delete_all({"x": 1})] ok',
        content='[Calling tool: delete_all({"x": 1})] ok',
    ),
    Case(
        "degraded-calling-tool-no-args",
        "[Calling tool=search()]",
        calls=[("search", {})],
    ),
    Case(
        "degraded-json-line",
        'I will search.\n{"name": "search", "arguments": {"query": "mlx"}}\n',
        content="I will search.",
        calls=[("search", {"query": "mlx"})],
    ),
    Case(
        "degraded-json-line-unknown-name",
        '{"name": "rm", "arguments": {"path": "/"}}',
        content='{"name": "rm", "arguments": {"path": "/"}}',
    ),
    Case(
        "degraded-json-not-alone-on-line",
        'Example: {"name": "search", "arguments": {"query": "x"}} is a call.',
        content='Example: {"name": "search", "arguments": {"query": "x"}} is a call.',
    ),
    Case(
        "degraded-json-line-with-text-after",
        '{"name": "search", "arguments": {"query": "x"}} and more',
        content='{"name": "search", "arguments": {"query": "x"}} and more',
    ),
    Case(
        "degraded-unwrapped-function",
        "<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>",
        calls=[(WEATHER, {"city": "Lima"})],
    ),
    Case(
        "degraded-unwrapped-function-unknown",
        "<function=nope>\n<parameter=a>\n1\n</parameter>\n</function>",
        content="<function=nope>\n<parameter=a>\n1\n</parameter>\n</function>",
    ),
    Case(
        "no-tools-no-degraded-recovery",
        '[Calling tool: get_weather({"city": "Oslo"})]',
        content='[Calling tool: get_weather({"city": "Oslo"})]',
        tools=[],
    ),
    Case(
        "text-around-a-call-keeps-a-separator",
        'Before.\n<tool_call>\n{"name": "search", "arguments": {"query": "q"}}\n</tool_call>\n'
        "After.",
        content="Before.\nAfter.",
        calls=[("search", {"query": "q"})],
    ),
    Case(
        "unicode-text-around-a-call",
        'Voilà 🌍:\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京"}}\n'
        "</tool_call>\nFin ✓",
        content="Voilà 🌍:\nFin ✓",
        calls=[(WEATHER, {"city": "東京"})],
    ),
    Case(
        "quotes-and-braces-inside-strings",
        '<tool_call>\n{"name": "search", "arguments": '
        '{"query": "say \\"hi\\" {x} [y] \'z\'"}}\n</tool_call>',
        calls=[("search", {"query": "say \"hi\" {x} [y] 'z'"})],
    ),
    Case(
        "escaped-unicode-and-newline-in-json-string",
        '<tool_call>{"name": "search", "arguments": {"query": "caf\\u00e9 \\n new"}}</tool_call>',
        calls=[("search", {"query": "café \n new"})],
    ),
    Case(
        "empty-arguments",
        '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>',
        calls=[("search", {})],
    ),
    Case(
        "arguments-key-missing-is-empty",
        '<tool_call>\n{"name": "search"}\n</tool_call>',
        calls=[("search", {})],
    ),
    Case(
        "three-calls",
        "".join(
            f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{q}"}}}}\n</tool_call>\n'
            for q in "abc"
        ),
        calls=[("search", {"query": q}) for q in "abc"],
    ),
    Case(
        "list-of-calls-in-one-block",
        '<tool_call>[{"name": "search", "arguments": {"query": "a"}}, '
        '{"name": "get_weather", "arguments": {"city": "b"}}]</tool_call>',
        calls=[("search", {"query": "a"}), (WEATHER, {"city": "b"})],
    ),
    Case(
        "nested-argument-values",
        '<tool_call>{"name": "other", "arguments": {"a": {"b": [1, {"c": null}]}, "t": true}}'
        "</tool_call>",
        calls=[("other", {"a": {"b": [1, {"c": None}]}, "t": True})],
    ),
    Case(
        "thinking-aloud-then-call",
        'I will call search.\n\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n'
        "</tool_call>",
        content="I will call search.",
        calls=[("search", {"query": "x"})],
    ),
    Case(
        "no-call-angle-brackets-and-tags",
        "Use x < y and <tool> tags; also </tool>.",
        content="Use x < y and <tool> tags; also </tool>.",
    ),
    Case(
        "truncated-in-json-name",
        '<tool_call>\n{"na',
        content='<tool_call>\n{"na',
    ),
    Case(
        "malformed-call-without-name",
        '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',
        content='<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',
    ),
    Case(
        "malformed-name-not-a-string",
        '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
        content='<tool_call>{"name": 5, "arguments": {}}</tool_call>',
    ),
    Case(
        "malformed-arguments-not-an-object",
        '<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>',
        content='<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>',
    ),
]


def xml_call(name: str, *params: tuple[str, str]) -> str:
    """A Qwen3-Coder XML call block, as the official template writes it."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


class TestHermesConformance(ParserConformance):
    """``hermes``: Qwen/Hermes JSON in ``<tool_call>``."""

    parser_class = HermesToolParser
    tokenizer_fixture = "qwen3_tokenizer"
    MARKERS = ("<tool_call>", "</tool_call>", "<function=", "[Calling tool", '{"name"')
    CASES = [
        *COMMON_CASES,
        Case("official-two-calls", HERMES_TWO_CALLS, content="Let me check.", calls=TWO_CALLS),
        Case(
            "official-qwen3-call-after-empty-think",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
            "</tool_call>",
            calls=[(WEATHER, PARIS)],
        ),
        Case(
            "arguments-as-json-string",
            '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Nice\\"}"}\n'
            "</tool_call>",
            calls=[(WEATHER, {"city": "Nice"})],
        ),
        Case(
            "parameters-key-and-unicode",
            '<tool_call>{"name": "get_weather", "parameters": {"city": "Zürich 🌧"}}</tool_call>',
            calls=[(WEATHER, {"city": "Zürich 🌧"})],
        ),
        Case(
            "string-number-typed-by-schema",
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": "2"}}'
            "</tool_call>",
            calls=[(WEATHER, {"city": "Oslo", "days": 2})],
        ),
        Case(
            "several-objects-in-one-block",
            '<tool_call>\n{"name": "search", "arguments": {"query": "a"}}\n'
            '{"name": "search", "arguments": {"query": "b"}}\n</tool_call>',
            calls=[("search", {"query": "a"}), ("search", {"query": "b"})],
        ),
        Case(
            "undeclared-tool-name-still-a-call",
            '<tool_call>{"name": "other", "arguments": {}}</tool_call>',
            calls=[("other", {})],
        ),
        Case(
            "closing-marker-inside-a-json-string",
            '<tool_call>\n{"name": "search", "arguments": {"query": "a </tool_call> b"}}\n'
            "</tool_call>\nDone.",
            content="Done.",
            calls=[("search", {"query": "a </tool_call> b"})],
        ),
        Case(
            "unterminated-string-then-a-good-call",
            '<tool_call>{"name": "search", "arguments": {"query": "a}}</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": {"query": "z"}}</tool_call>',
            content='<tool_call>{"name": "search", "arguments": {"query": "a}}</tool_call>',
            calls=[("search", {"query": "z"})],
        ),
        Case(
            "broken-json-returned-as-content",
            'A\n<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>\nB',
            content='A\n<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>\nB',
        ),
        Case(
            "broken-block-then-good-block",
            '<tool_call>{"name": <tool_call>{"name": "search", "arguments": {"query": "z"}}'
            "</tool_call>",
            content='<tool_call>{"name":',
            calls=[("search", {"query": "z"})],
        ),
        Case(
            "complete-call-missing-closer-at-end",
            '<tool_call>\n{"name": "search", "arguments": {"query": "end"}}\n',
            calls=[("search", {"query": "end"})],
        ),
        Case(
            "xml-body-accepted-too",
            "<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</parameter>\n"
            "</function>\n</tool_call>",
            calls=[(WEATHER, {"days": 4})],
        ),
    ]


class TestQwen3CoderConformance(ParserConformance):
    """``qwen3_coder``: XML in ``<tool_call>``, values typed by the schema."""

    parser_class = Qwen3CoderToolParser
    tokenizer_fixture = "qwen3_tokenizer"
    MARKERS = ("<tool_call>", "</tool_call>", "<function=", "[Calling tool", '{"name"')
    CASES = [
        *COMMON_CASES,
        Case("official-two-calls", XML_TWO_CALLS, content="Let me check.", calls=TWO_CALLS),
        Case(
            "every-schema-type",
            "<tool_call>\n<function=typed>\n"
            + "".join(
                f"<parameter={k}>\n{v}\n</parameter>\n"
                for k, v in [
                    ("i", "42"),
                    ("n", "1.5"),
                    ("b", "true"),
                    ("z", "null"),
                    ("arr", "[1, 2, 3]"),
                    ("obj", '{"k": {"deep": [true, null]}}'),
                    ("u", "not a number"),
                    ("s", "007"),
                    ("e", "b"),
                    ("t", "null"),
                ]
            )
            + "</function>\n</tool_call>",
            calls=[
                (
                    "typed",
                    {
                        "i": 42,
                        "n": 1.5,
                        "b": True,
                        "z": None,
                        "arr": [1, 2, 3],
                        "obj": {"k": {"deep": [True, None]}},
                        "u": "not a number",
                        "s": "007",
                        "e": "b",
                        "t": None,
                    },
                )
            ],
            tools=TYPED_TOOLS,
        ),
        Case(
            "values-that-do-not-fit-stay-text",
            "<tool_call>\n<function=typed>\n<parameter=i>\n4.5\n</parameter>\n"
            "<parameter=b>\nmaybe\n</parameter>\n<parameter=s>\nnull\n</parameter>\n"
            "<parameter=extra>\n{not: json}\n</parameter>\n</function>\n</tool_call>",
            calls=[("typed", {"i": "4.5", "b": "maybe", "s": "null", "extra": "{not: json}"})],
            tools=TYPED_TOOLS,
        ),
        Case(
            "multi-line-string-kept-exactly",
            "<tool_call>\n<function=search>\n<parameter=query>\n  line one\n\n  line two\n"
            "</parameter>\n</function>\n</tool_call>",
            calls=[("search", {"query": "  line one\n\n  line two"})],
        ),
        Case(
            "missing-parameter-closers",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
            "<parameter=days>\n3\n</function>\n</tool_call>",
            calls=[(WEATHER, PARIS)],
        ),
        Case(
            "truncated-mid-parameter",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
            content="<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        ),
        Case(
            "junk-inside-block-is-content",
            "<tool_call>\nI am not XML\n</tool_call>",
            content="<tool_call>\nI am not XML\n</tool_call>",
        ),
        Case(
            "json-body-accepted-too",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
            "</tool_call>",
            calls=[(WEATHER, PARIS)],
        ),
        Case(
            "xml-quotes-braces-and-tags-in-value",
            xml_call("search", ("query", "say \"hi\" {x} [y] 'z' <b>")),
            calls=[("search", {"query": "say \"hi\" {x} [y] 'z' <b>"})],
        ),
        Case(
            "xml-unicode-values-and-text-around",
            "Voilà 🌍\n\n"
            + xml_call(WEATHER, ("city", "東京 — Zürich"), ("days", "2"))
            + "\nFin ✓",
            content="Voilà 🌍\nFin ✓",
            calls=[(WEATHER, {"city": "東京 — Zürich", "days": 2})],
        ),
        Case("xml-empty-arguments", xml_call("search"), calls=[("search", {})]),
        Case(
            "xml-three-calls",
            "\n".join(xml_call("search", ("query", q)) for q in "abc"),
            calls=[("search", {"query": q}) for q in "abc"],
        ),
        Case(
            "xml-closing-like-text-and-markup-in-value",
            xml_call("search", ("query", "<div>\n  x < y </param>\n</div>")),
            calls=[("search", {"query": "<div>\n  x < y </param>\n</div>"})],
        ),
        Case(
            "xml-text-after-calls",
            xml_call("search", ("query", "q")) + "\n\nI called it.",
            content="I called it.",
            calls=[("search", {"query": "q"})],
        ),
        Case(
            "xml-number-for-string-stays-string-and-enum",
            xml_call(WEATHER, ("city", "1984"), ("unit", "celsius")),
            calls=[(WEATHER, {"city": "1984", "unit": "celsius"})],
        ),
        Case(
            "xml-complete-call-missing-block-closer",
            "<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n</function>\n",
            calls=[("search", {"query": "q"})],
        ),
        Case(
            "xml-truncated-in-function-name",
            "Ok.\n<tool_call>\n<function=get_wea",
            content="Ok.\n<tool_call>\n<function=get_wea",
        ),
        Case(
            "xml-malformed-empty-function-name",
            "<tool_call>\n<function=>\n</function>\n</tool_call>",
            content="<tool_call>\n<function=>\n</function>\n</tool_call>",
        ),
    ]


class TestThinkConformance(ParserConformance):
    """``think``: ``<think>...</think>``."""

    parser_class = ThinkReasoningParser
    tokenizer_fixture = "qwen3_tokenizer"
    MARKERS = ("<think>", "</think>")
    PROMPTS = [
        ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        ("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n", False),
        ("]~b]user\nhi[e~[\n]~b]ai\n<think>\n", True),
        ("", False),
    ]
    CASES = [
        Case(
            "qwen3-think-then-answer",
            "<think>\nThe user greets me.\n</think>\n\nHello!",
            content="Hello!",
            reasoning="The user greets me.",
        ),
        Case(
            "prompt-opened-think",
            "Plan: answer briefly.\n</think>\n\nHi.",
            content="Hi.",
            reasoning="Plan: answer briefly.",
            starts_in_reasoning=True,
        ),
        Case("no-tags-is-content", "Plain answer\n", content="Plain answer\n"),
        Case(
            "prompt-opened-never-closed-is-reasoning",
            "Still thinking when max_tokens hit",
            reasoning="Still thinking when max_tokens hit",
            starts_in_reasoning=True,
        ),
        Case(
            "explicit-open-never-closed-is-reasoning",
            "<think>\nhalfway",
            reasoning="halfway",
        ),
        Case("empty-think", "<think>\n\n</think>\n\nOK", content="OK"),
        Case("stray-close-dropped", "a</think>b", content="ab"),
        Case(
            "multi-line-reasoning-kept",
            "<think>\nstep 1\n\nstep 2\n</think>\nanswer",
            content="answer",
            reasoning="step 1\n\nstep 2",
        ),
        Case(
            "tool-call-ends-unclosed-reasoning",
            "I should look it up.\n\n<tool_call>\n{}\n</tool_call>",
            content="<tool_call>\n{}\n</tool_call>",
            reasoning="I should look it up.",
            starts_in_reasoning=True,
        ),
        Case(
            "tool-call-tag-mentioned-mid-line-stays-reasoning",
            "Use the <tool_call> format.\n</think>\nDone",
            content="Done",
            reasoning="Use the <tool_call> format.",
            starts_in_reasoning=True,
        ),
        Case(
            "repeated-open-dropped",
            "<think>a<think>b</think>c",
            content="c",
            reasoning="ab",
        ),
        Case(
            "partial-close-at-end-stays-reasoning",
            "<think>\nx </thi",
            reasoning="x </thi",
        ),
        Case(
            "unicode-reasoning-and-answer",
            "<think>\nLe café ☕ coûte 3 €; 日本語.\n</think>\n\nRéponse: 3 € ✓",
            content="Réponse: 3 € ✓",
            reasoning="Le café ☕ coûte 3 €; 日本語.",
        ),
        Case(
            "quotes-and-braces-in-reasoning",
            '<think>\nThe JSON is {"a": "b"} and [1, 2].\n</think>\n\nDone.',
            content="Done.",
            reasoning='The JSON is {"a": "b"} and [1, 2].',
        ),
        Case(
            "reasoning-then-call-passed-on",
            '<think>\nI need the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
            '"arguments": {}}\n</tool_call>',
            content='<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
            reasoning="I need the weather.",
        ),
        Case(
            "prompt-opened-reasoning-then-call",
            'Need data.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {}}\n'
            "</tool_call>",
            content='<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>',
            reasoning="Need data.",
            starts_in_reasoning=True,
        ),
        Case(
            "prompt-opened-empty-reasoning",
            "\n</think>\n\nHi",
            content="Hi",
            starts_in_reasoning=True,
        ),
        Case("prompt-opened-close-at-once", "</think>Hi", content="Hi", starts_in_reasoning=True),
        Case(
            "prompt-opened-and-model-opens-again",
            "<think>\nnested open\n</think>\n\nok",
            content="ok",
            reasoning="nested open",
            starts_in_reasoning=True,
        ),
        Case(
            "text-before-and-after-block",
            "Hmm. <think>inner</think> after",
            content="Hmm. after",
            reasoning="inner",
        ),
        Case(
            "angle-brackets-in-answer",
            "<think>x</think>\n\nUse a < b and <b>bold</b>.",
            content="Use a < b and <b>bold</b>.",
            reasoning="x",
        ),
        Case(
            "tag-prefix-in-answer-is-text",
            "<think>ok</think>\n\nThe word think and <thin are fine.",
            content="The word think and <thin are fine.",
            reasoning="ok",
        ),
        Case("whitespace-only-reasoning", "<think>\n   \n</think>\n\nAnswer", content="Answer"),
        Case("no-output", ""),
        Case("prompt-opened-no-output", "", starts_in_reasoning=True),
        Case("truncated-open-tag-is-content", "Answer <thi", content="Answer <thi"),
        Case(
            "trailing-newlines-of-answer-kept",
            "<think>\nr\n</think>\n\n\nAnswer\n\n",
            content="Answer\n\n",
            reasoning="r",
        ),
        Case(
            "crlf-line-ends",
            "<think>\r\nr\r\n</think>\r\n\r\nAnswer",
            content="Answer",
            reasoning="r",
        ),
        Case(
            "degraded-call-text-inside-reasoning-stays-reasoning",
            "Plan: [Calling tool: search({})]\n</think>\nok",
            content="ok",
            reasoning="Plan: [Calling tool: search({})]",
            starts_in_reasoning=True,
        ),
        Case("emoji", "<think>🎉🎉</think>🎉", content="🎉", reasoning="🎉🎉"),
    ]
