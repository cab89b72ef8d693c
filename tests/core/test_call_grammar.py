"""Call grammars in each parser's own format (decision 0023), with real tokenizers and
real llguidance: what the official chat template writes for a call is accepted up to
its closer and read back by the parser; arguments outside the schema are refused;
schemas a format cannot express are named."""

from __future__ import annotations

import json
import logging
from typing import Any

import llguidance
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxcore.parsers.base import ToolParser
from mlxcore.parsers.qwen import HermesToolParser, Qwen3CoderToolParser
from mlxcore.request_builder import OutputConstraint
from mlxcore.structured import compiled_tokenizer
from mlxcore.structured.call_grammar import (
    GrammarKit,
    GrammarUnsupported,
    special_token_finder,
    tool_call_grammar,
)
from mlxcore.testing.conformance import find_chat_template, loaded_test_model, render_chat
from mlxcore.testing.tool_call_cases import TOOLS, check_calls
from mlxcore.tool_grammar import tool_call_constraint
from mlxcore_gemma4 import Gemma4ToolParser
from mlxcore_minimax import MiniMaxM2ToolParser

FAMILIES: dict[str, tuple[str, type[ToolParser], str, str, str]] = {
    # parser: (test model, parser class, template, opener, closer)
    "hermes": ("qwen3", HermesToolParser, "Qwen-Qwen3-0.6B.jinja", "<tool_call>", "</tool_call>"),
    "qwen3_coder": (
        "qwen3_5", Qwen3CoderToolParser, "Qwen3.5-4B.jinja", "<tool_call>", "</tool_call>"
    ),
    "gemma4": (
        "gemma4_text", Gemma4ToolParser, "google-gemma-4-31B-it.jinja", "<|tool_call>",
        "<tool_call|>",
    ),
    "minimax_m2": (
        "minimax", MiniMaxM2ToolParser, "MiniMax-M2.jinja", "<minimax:tool_call>",
        "</minimax:tool_call>",
    ),
}  # fmt: skip

CALLS = [
    ("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}),
    (
        "search_files",
        {"query": "todo", "paths": ["src", "docs"],
         "options": {"case_sensitive": True, "max_results": 5}},
    ),
    (
        "create_event",
        {"title": "Sync", "attendees": [{"name": "Ana", "role": "host"}], "priority": "high"},
    ),
]  # fmt: skip


def _tokenizer(arch: str) -> Any:
    return loaded_test_model(arch).tokenizer


def _lazy(parser: str, tools: list[dict[str, Any]] = TOOLS) -> tuple[Any, Any]:
    arch, cls, *_ = FAMILIES[parser]
    tokenizer = _tokenizer(arch)
    compiled = compiled_tokenizer(tokenizer)
    special = special_token_finder(tokenizer, compiled.ll.is_special_token)
    return tool_call_grammar(cls.call_grammar, tools, special), tokenizer


def _matcher(tokenizer: Any, grammar: str) -> llguidance.LLMatcher:
    matcher = llguidance.LLMatcher(compiled_tokenizer(tokenizer).ll, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _rendered_call(parser: str, name: str, arguments: dict[str, Any]) -> str:
    """What the official template writes for one call: from the opener to the closer."""
    _, _, template_name, opener, closer = FAMILIES[parser]
    template = find_chat_template(template_name)
    assert template is not None
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "user", "content": "thanks"},
    ]
    text = render_chat(template, messages, tools=TOOLS)
    start = text.rindex(opener)
    end = text.index(closer, start) + len(closer)
    return text[start:end]


@pytest.mark.parametrize("parser", list(FAMILIES))
@pytest.mark.parametrize(("name", "arguments"), CALLS, ids=[c[0] for c in CALLS])
def test_the_template_call_is_accepted_and_read_back(
    parser: str, name: str, arguments: dict[str, Any]
) -> None:
    lazy, tokenizer = _lazy(parser)
    cls = FAMILIES[parser][1]
    text = _rendered_call(parser, name, arguments)
    assert text.startswith(lazy.opener)
    ids = tokenizer.encode(text[len(lazy.opener) :], add_special_tokens=False)
    matcher = _matcher(tokenizer, lazy.grammar)
    consumed = matcher.try_consume_tokens(ids)
    assert consumed == len(ids), (text, tokenizer.decode(ids[consumed:]))
    assert matcher.is_stopped()  # the closer ends the call: nothing more is asked
    out = cls(TOOLS).parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [(name, arguments)]
    assert not check_calls([(c.name, c.arguments) for c in out.tool_calls]).invalid


@pytest.mark.parametrize("parser", list(FAMILIES))
def test_arguments_outside_the_schema_are_refused(parser: str) -> None:
    lazy, tokenizer = _lazy(parser)
    good = _rendered_call(parser, "get_weather", {"city": "Paris", "unit": "celsius"})
    bad = good.replace("celsius", "kelvin")
    assert bad != good
    ids = tokenizer.encode(bad[len(lazy.opener) :], add_special_tokens=False)
    matcher = _matcher(tokenizer, lazy.grammar)
    assert matcher.try_consume_tokens(ids) < len(ids)
    unknown = good.replace("get_weather", "get_wether")
    ids = tokenizer.encode(unknown[len(lazy.opener) :], add_special_tokens=False)
    assert _matcher(tokenizer, lazy.grammar).try_consume_tokens(ids) < len(ids)


@pytest.mark.parametrize("parser", list(FAMILIES))
def test_a_missing_required_argument_is_refused(parser: str) -> None:
    lazy, tokenizer = _lazy(parser)
    text = _rendered_call(parser, "get_weather", {"city": "Paris"})  # no "unit"
    ids = tokenizer.encode(text[len(lazy.opener) :], add_special_tokens=False)
    assert _matcher(tokenizer, lazy.grammar).try_consume_tokens(ids) < len(ids)


@pytest.mark.parametrize("parser", list(FAMILIES))
def test_the_closer_is_the_special_token_where_the_tokenizer_has_one(parser: str) -> None:
    lazy, tokenizer = _lazy(parser)
    closer = FAMILIES[parser][4]
    (closer_id,) = tokenizer.encode(closer, add_special_tokens=False)
    assert f"<[{closer_id}]>" in lazy.grammar


def test_forced_choices_start_with_the_opener_and_may_repeat() -> None:
    arch, cls, *_ = FAMILIES["hermes"]
    tokenizer = _tokenizer(arch)
    special = special_token_finder(tokenizer, compiled_tokenizer(tokenizer).ll.is_special_token)
    required = tool_call_grammar(cls.call_grammar, TOOLS, special, mode="required")
    one = _rendered_call("hermes", *CALLS[0])
    two = one + "\n" + _rendered_call("hermes", *CALLS[2])
    for text in (one, two):
        ids = tokenizer.encode(text, add_special_tokens=False)
        matcher = _matcher(tokenizer, required.grammar.grammar)
        assert matcher.try_consume_tokens(ids) == len(ids)
        assert matcher.is_accepting()
    single = tool_call_grammar(cls.call_grammar, TOOLS, special, mode="required", parallel=False)
    ids = tokenizer.encode(two, add_special_tokens=False)
    assert _matcher(tokenizer, single.grammar.grammar).try_consume_tokens(ids) < len(ids)
    named = tool_call_grammar(cls.call_grammar, TOOLS, special, mode="named", name="create_event")
    ids = tokenizer.encode(one, add_special_tokens=False)  # a get_weather call
    assert _matcher(tokenizer, named.grammar.grammar).try_consume_tokens(ids) < len(ids)
    text = "prose first " + one
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert _matcher(tokenizer, required.grammar.grammar).try_consume_tokens(ids) == 0


def _tool(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required or []}
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


@pytest.mark.parametrize(
    ("parser", "schema", "reason"),
    [
        ("qwen3_coder", {"type": "string", "pattern": "^[a-z]+$"}, "pattern"),
        ("minimax_m2", {"type": "string", "pattern": "^[a-z]+$"}, "pattern"),
        ("qwen3_coder", {"enum": ["a", 1]}, "mixing"),
        ("qwen3_coder", {"type": ["string", "integer"], "minimum": 3}, "constraints"),
        ("gemma4", {"type": "string", "pattern": "^[a-z]+$"}, "pattern"),
        ("gemma4", {"not": {"type": "string"}}, "not"),
        ("gemma4", {"type": "array", "uniqueItems": True}, "uniqueItems"),
    ],
)
def test_what_a_format_cannot_express_is_named(parser: str, schema: Any, reason: str) -> None:
    with pytest.raises(GrammarUnsupported, match=reason):
        _lazy(parser, [_tool({"x": schema}, ["x"])])


def test_hermes_takes_any_schema_llguidance_compiles() -> None:
    lazy, _ = _lazy("hermes", [_tool({"x": {"type": "string", "pattern": "^[a-z]+$"}}, ["x"])])
    assert "pattern" in lazy.grammar


def test_refs_are_followed_in_text_formats() -> None:
    tool = _tool({"x": {"$ref": "#/$defs/Unit"}}, ["x"])
    tool["function"]["parameters"]["$defs"] = {"Unit": {"enum": ["c", "f"]}}
    lazy, tokenizer = _lazy("qwen3_coder", [tool])
    good = "\n<function=f>\n<parameter=x>\nc\n</parameter>\n</function>\n</tool_call>"
    ids = tokenizer.encode(good, add_special_tokens=False)
    assert _matcher(tokenizer, lazy.grammar).try_consume_tokens(ids) == len(ids)
    ids = tokenizer.encode(good.replace("\nc\n", "\nx\n"), add_special_tokens=False)
    assert _matcher(tokenizer, lazy.grammar).try_consume_tokens(ids) < len(ids)


def test_a_raw_text_value_never_holds_the_markup() -> None:
    lazy, tokenizer = _lazy("qwen3_coder", [_tool({"x": {"type": "string"}}, ["x"])])
    prefix = "\n<function=f>\n<parameter=x>\n"
    inner = prefix + "a < b and </parameter> too"
    ids = tokenizer.encode(inner, add_special_tokens=False)
    consumed = _matcher(tokenizer, lazy.grammar).try_consume_tokens(ids)
    assert consumed < len(ids)
    written = tokenizer.decode(ids[:consumed])
    assert written.startswith(prefix + "a < b and <")  # a "<" alone is text
    assert "</parameter>" not in written[len(prefix) :]


def test_ordered_items_keep_their_order_and_optionality() -> None:
    tokenizer = _tokenizer("qwen3")
    kit = GrammarKit(lambda _: None)
    start = kit.ordered([('"a"', False), ('"b"', True), ('"c"', False)], '","')
    grammar = kit.lark(f'"[" {start} "]"')
    for text, ok in [
        ("[b]", True), ("[a,b]", True), ("[b,c]", True), ("[a,b,c]", True),
        ("[]", False), ("[a]", False), ("[b,a]", False), ("[a,,b]", False), ("[a,b,]", False),
    ]:  # fmt: skip
        ids = tokenizer.encode(text, add_special_tokens=False)
        matcher = _matcher(tokenizer, grammar)
        accepted = matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()
        assert accepted is ok, text


_NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
_LEAF = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(
            ["string", "integer", "number", "boolean", "null", "object", "array", "weird"]
        )
        | st.lists(st.sampled_from(["string", "integer", "null"]), max_size=3),
        "enum": st.lists(st.one_of(st.text(max_size=5), st.integers(), st.none()), max_size=3),
        "minLength": st.integers(-2, 5),
        "maxLength": st.integers(-2, 5),
        "pattern": st.sampled_from(["^[a-z]+$", "(", "[", ".*"]),
        "minimum": st.integers(-5, 5),
        "format": st.sampled_from(["uri", "date-time", "nonsense"]),
        "$ref": st.sampled_from(["#/$defs/A", "#/nowhere", "http://x"]),
    },
)
_SCHEMAS = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(_NAMES, inner, max_size=3)},
            optional={
                "required": st.lists(_NAMES, max_size=2),
                "additionalProperties": st.booleans() | inner,
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner},
            optional={"minItems": st.integers(-1, 3), "maxItems": st.integers(-1, 3)},
        ),
        st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"not": inner}),
    ),
    max_leaves=6,
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=_NAMES, parameters=_SCHEMAS, mode=st.sampled_from(["auto", "required", "named"]))
@pytest.mark.parametrize("parser", list(FAMILIES))
def test_any_tool_schema_gives_a_grammar_or_a_named_fallback(
    parser: str, name: str, parameters: dict[str, Any], mode: str, caplog: Any
) -> None:
    """Generated tool schemas, good and bad: each gives a grammar that compiles or
    leaves the request unconstrained (``None``) for a named reason, never an exception
    (nor the warning of a grammar builder that failed)."""
    arch, cls, *_ = FAMILIES[parser]
    tokenizer = _tokenizer(arch)
    parameters = {**parameters, "$defs": {"A": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": name or "f", "parameters": parameters}}]
    current = None
    if mode != "auto":
        current = OutputConstraint(
            None, tool_mode=mode, tool_name=name or "f" if mode == "named" else None
        )
    with caplog.at_level(logging.DEBUG, logger="mlxcore.tool_grammar"):
        planned = tool_call_constraint(cls, tokenizer, tools, current)
    failed = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not failed
    if planned is not None:
        compiled_tokenizer(tokenizer).matcher(planned.value)  # compiles (cached)


def test_a_failing_parser_grammar_leaves_the_request_unconstrained(caplog: Any) -> None:
    class Broken(HermesToolParser):
        name = "broken"

        @classmethod
        def call_grammar(cls, functions: Any, kit: Any) -> Any:
            raise KeyError("oops")

    with caplog.at_level(logging.INFO, logger="mlxcore.tool_grammar"):
        assert tool_call_constraint(Broken, _tokenizer("qwen3"), TOOLS, None) is None
    assert any(r.levelno == logging.WARNING and "broken" in r.getMessage() for r in caplog.records)
    assert tool_call_constraint(HermesToolParser, _tokenizer("qwen3"), TOOLS, None) is not None
