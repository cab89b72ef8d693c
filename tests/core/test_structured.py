"""Constrained decoding on a real tiny Qwen3 (random weights, real tokenizer), real llguidance.

Unconstrained, the random weights write garbage; output that parses and validates
against the schema therefore shows the constraint at work. Outputs are validated
with msgspec against the very types the schemas are generated from.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import attrs
import mlx.core as mx
import msgspec
import pytest
from msgspec import Meta

from mlxcore.config import ServerConfig
from mlxcore.engine.events import Event, FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime
from mlxcore.structured import (
    OPTION,
    START_AFTER_OPTION,
    ConstrainedToolCallParser,
    ConstraintError,
    ConstraintViolation,
    JsonObject,
    JsonSchema,
    LarkGrammar,
    Regex,
    compiled_tokenizer,
    from_response_format,
    make_processor,
    named_tool_schema,
    required_tools_schema,
    tool_choice_constraint,
    validate,
)
from mlxcore.structured.constraints import close_objects


class Address(msgspec.Struct, forbid_unknown_fields=True):
    city: Annotated[str, Meta(max_length=12)]
    zip: Annotated[str, Meta(pattern="^[0-9]{5}$")]


class Person(msgspec.Struct, forbid_unknown_fields=True):
    name: Annotated[str, Meta(max_length=12)]
    age: Annotated[int, Meta(ge=0, le=120)]
    role: Literal["admin", "editor", "viewer"]
    active: bool
    address: Address
    tags: Annotated[list[Annotated[str, Meta(max_length=8)]], Meta(max_length=3)]
    nickname: Annotated[str, Meta(max_length=8)] | None = None


class Weather(msgspec.Struct, forbid_unknown_fields=True):
    city: Annotated[str, Meta(max_length=10)]
    unit: Literal["celsius", "fahrenheit"]


class Search(msgspec.Struct, forbid_unknown_fields=True):
    query: Annotated[str, Meta(max_length=10)]
    limit: Annotated[int, Meta(ge=1, le=5)]


PERSON = msgspec.json.schema(Person)  # nested object, $ref/$defs, enum, array, required
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": msgspec.json.schema(Weather)},
    },
    {"type": "function", "function": {"name": "search", "parameters": msgspec.json.schema(Search)}},
]
TOOL_TYPES: dict[str, type[msgspec.Struct]] = {"get_weather": Weather, "search": Search}
SAMPLINGS = [
    pytest.param(SamplingParams(), id="greedy"),
    pytest.param(SamplingParams(temperature=1.0, seed=7), id="sampled"),
]


@pytest.fixture(scope="module")
def rt(tiny_qwen3: Path) -> Iterator[Runtime]:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("mlxcore.builtin.structured",), autoload=False))
    hooks = PluginHooks(pm)
    config = ServerConfig(model=str(tiny_qwen3))
    hooks.configure(config)
    runtime = build_runtime(config, hooks)
    yield runtime
    runtime.engine.shutdown()


def request(
    rt: Runtime, text: str, sampling: SamplingParams, max_tokens: int = 96, **options: Any
) -> GenerationRequest:
    prompt = tuple(rt.tokenizer.encode(text))
    return GenerationRequest(prompt, max_tokens=max_tokens, sampling=sampling, options=options)


def run_all(rt: Runtime, requests: list[GenerationRequest]) -> list[tuple[str, FinishEvent]]:
    """Submit every request before waiting, so they share the running batch."""
    sinks: list[queue.SimpleQueue[Event]] = []
    for req in requests:
        sinks.append(queue.SimpleQueue())
        rt.engine.submit(req, sinks[-1].put)
    out = []
    for sink in sinks:
        tokens: list[int] = []
        while True:
            event = sink.get(timeout=120)
            if isinstance(event, TokenEvent):
                tokens.extend(t.token for t in event.tokens)
            elif isinstance(event, FinishEvent):
                break
        kept = [t for t in tokens if t not in rt.info.eos_token_ids]
        out.append((rt.tokenizer.decode(kept), event))
    return out


def run(rt: Runtime, req: GenerationRequest) -> tuple[str, FinishEvent]:
    return run_all(rt, [req])[0]


# -- through the real engine ---------------------------------------------------


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_json_schema_output_validates(rt: Runtime, sampling: SamplingParams) -> None:
    constraint = from_response_format(
        {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    )
    text, finish = run(rt, request(rt, "A person as JSON:", sampling, **{OPTION: constraint}))
    assert finish.reason == "stop", (finish, text)
    msgspec.json.decode(text, type=Person)  # raises if it does not validate


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_json_object_mode_yields_an_object(rt: Runtime, sampling: SamplingParams) -> None:
    # Random weights never close a free-form string by themselves; a logit bias on the
    # closing quote (a real request field) makes them, and the grammar does the rest.
    sampling = attrs.evolve(sampling, logit_bias={1: 12.0, 92: 6.0})
    constraint = from_response_format({"type": "json_object"})
    assert constraint == JsonObject()
    text, finish = run(rt, request(rt, "Any JSON:", sampling, **{OPTION: constraint}))
    assert finish.reason == "stop", (finish, text)
    value = json.loads(text)
    # an empty object is a valid answer too: which one a seed gives is the sampler's luck
    assert isinstance(value, dict), text


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_named_tool_choice_gives_valid_arguments(rt: Runtime, sampling: SamplingParams) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    found = tool_choice_constraint(TOOLS, choice)
    assert found is not None
    constraint, parser = found
    text, finish = run(rt, request(rt, "Weather?", sampling, **{OPTION: constraint}))
    assert finish.reason == "stop", (finish, text)
    parsed = parser.parse(text)
    assert parsed.content == ""
    [call] = parsed.tool_calls
    assert call.name == "get_weather"
    msgspec.json.decode(call.arguments, type=Weather)


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_required_tool_choice_gives_known_calls(rt: Runtime, sampling: SamplingParams) -> None:
    found = tool_choice_constraint(TOOLS, "required")
    assert found is not None
    constraint, parser = found
    text, finish = run(rt, request(rt, "Use a tool:", sampling, 128, **{OPTION: constraint}))
    assert finish.reason == "stop", (finish, text)
    parsed = parser.parse(text)
    assert parsed.content == "" and parsed.tool_calls, text
    for call in parsed.tool_calls:
        msgspec.json.decode(call.arguments, type=TOOL_TYPES[call.name])


def test_constrained_and_free_requests_share_a_batch(rt: Runtime) -> None:
    free = request(rt, "Tell me a story", SamplingParams(), 24)
    alone, _ = run(rt, free)
    search_args = JsonSchema(named_tool_schema(TOOLS, "search"))
    batch = [
        request(
            rt, "A person:", SamplingParams(temperature=1.0, seed=3), **{OPTION: JsonSchema(PERSON)}
        ),
        free,
        request(rt, "Search:", SamplingParams(), **{OPTION: search_args}),
    ]
    (person, f1), (text, f2), (search, f3) = run_all(rt, batch)
    assert (f1.reason, f2.reason, f3.reason) == ("stop", "length", "stop")
    msgspec.json.decode(person, type=Person)
    msgspec.json.decode(search, type=Search)
    assert text == alone  # the constraints did not leak into the free request


def test_start_after_lets_the_model_think_first(rt: Runtime) -> None:
    # Without "</think>" in the output, nothing is constrained: random weights do not
    # write JSON; the unconstrained run and the deferred one are identical.
    free, _ = run(rt, request(rt, "Think:", SamplingParams(), 16))
    deferred, _ = run(
        rt,
        request(
            rt,
            "Think:",
            SamplingParams(),
            16,
            **{OPTION: JsonObject(), START_AFTER_OPTION: "</think>"},
        ),
    )
    assert deferred == free


def test_a_plain_option_value_fails_only_that_request(rt: Runtime) -> None:
    _, finish = run(rt, request(rt, "x", SamplingParams(), 4, **{OPTION: {"type": "object"}}))
    assert finish.reason == "error" and "mlxcore.structured constraint" in (finish.error or "")


# -- the processor itself ----------------------------------------------------------


def allowed(logits: mx.array) -> set[int]:
    finite: list[bool] = mx.isfinite(logits[0]).tolist()  # type: ignore[assignment]
    return {i for i, ok in enumerate(finite) if ok}


def test_processor_masks_forces_eos_and_refuses_forbidden_tokens(rt: Runtime) -> None:
    tok = rt.tokenizer
    width = rt.model.args.vocab_size + 64  # logits wider than the vocabulary are masked too
    proc = make_processor(tok, Regex("(yes|no)"), prompt_len=2)
    logits = mx.zeros((1, width))
    context = [5, 6]
    first = allowed(proc(mx.array(context), logits))
    assert tok.encode("yes")[0] in first and tok.encode("maybe")[0] not in first
    assert max(first) < len(tok.vocab)
    context += tok.encode("yes")
    last = mx.array(context)[-1:] + 0  # the newest token as a lazy array, as the decoder has it
    after = allowed(proc(mx.concatenate([mx.array(context[:-1]), last]), logits))
    assert after == set(compiled_tokenizer(tok).eos_token_ids)  # complete: EOS is forced
    assert proc.done
    with pytest.raises(ConstraintViolation, match="not allowed by the regex constraint"):
        proc(mx.array([*context, tok.encode("!")[0]]), logits)


def test_a_mask_token_the_matcher_refuses_is_dropped_and_none_left_is_a_request_fault() -> None:
    """llguidance 1.9 allows, on SmolLM2's byte-level vocabulary, the first byte token of a
    forced rare 4-byte character and then refuses it (found by the reliability fuzz)."""
    from mlx_lm.utils import load_tokenizer

    from mlxcore.errors import RequestFault
    from mlxcore.models.default import ensure_default_model
    from mlxcore.structured import ConstraintUnsatisfiable

    tok = load_tokenizer(ensure_default_model())
    logits = mx.zeros((1, len(tok.vocab)))
    for pattern, context in [("\U00055950", [5]), ("x\U00055950y", [5, tok.encode("x")[0]])]:
        proc = make_processor(tok, Regex(pattern), prompt_len=1)
        with pytest.raises(ConstraintUnsatisfiable, match="cannot be followed") as err:
            for end in range(1, len(context) + 1):
                proc(mx.array(context[:end]), logits)
        assert isinstance(err.value, RequestFault) and err.value.code == "unsatisfiable_constraint"
        assert len(proc.generated) == len(context) - 1
    proc = make_processor(tok, Regex("a\U0001f600"), prompt_len=1)  # followable: untouched
    context = [5]
    for _ in range(8):
        if proc.done:
            break
        (choice,) = allowed(proc(mx.array(context), logits))
        context.append(choice)
    assert context[-1] in tok.eos_token_ids and tok.decode(context[1:-1]) == "a\U0001f600"


def test_processor_rolls_back_with_a_shorter_context(rt: Runtime) -> None:
    tok = rt.tokenizer
    proc = make_processor(tok, Regex("ab|cd"))
    logits = mx.zeros((1, len(tok.vocab)))
    a, c = tok.encode("a")[0], tok.encode("c")[0]
    proc(mx.array([9]), logits)
    proc(mx.array([9, a]), logits)
    proc(mx.array([9]), logits)  # a speculative decoder took "a" back
    assert a in allowed(proc(mx.array([9]), logits))
    proc(mx.array([9, c]), logits)  # "c" is fine after the rollback
    assert tok.encode("d")[0] in allowed(proc(mx.array([9, c]), logits))


def test_processor_waits_for_start_after(rt: Runtime) -> None:
    tok = rt.tokenizer
    think_end = tok.encode("</think>", add_special_tokens=False)
    proc = make_processor(tok, JsonObject(), start_after=think_end)
    logits = mx.zeros((1, len(tok.vocab)))
    context = [7, 8]
    assert len(allowed(proc(mx.array(context), logits))) == len(tok.vocab)
    context += tok.encode("hmm", add_special_tokens=False) + think_end
    assert not proc.active
    after = allowed(proc(mx.array(context), logits))
    assert proc.active and tok.encode("{")[0] in after and tok.encode("hmm")[0] not in after


def test_processor_constrains_from_the_first_token_unless_the_model_opens_its_reasoning(
    rt: Runtime,
) -> None:
    """A reasoning model whose prompt did not open a think block: JSON from the first
    token, with the opening tag offered beside it; once the model opens the block the
    output is free until it closes; a rollback to the start restores both choices."""
    tok = rt.tokenizer
    (opener,) = tok.encode("<think>", add_special_tokens=False)
    think_end = tok.encode("</think>", add_special_tokens=False)
    logits = mx.zeros((1, len(tok.vocab)))
    brace, hmm = tok.encode("{")[0], tok.encode("hmm")[0]

    plain = make_processor(tok, JsonObject(), start_after=think_end, may_open=opener)
    first = allowed(plain(mx.array([7, 8]), logits))
    assert brace in first and opener in first and hmm not in first
    assert opener not in allowed(plain(mx.array([7, 8, brace]), logits))  # only at the start

    thinking = make_processor(tok, JsonObject(), start_after=think_end, may_open=opener)
    thinking(mx.array([7, 8]), logits)
    context = [7, 8, opener, hmm]
    assert len(allowed(thinking(mx.array(context), logits))) == len(tok.vocab)  # free
    assert not thinking.active
    context += think_end
    after = allowed(thinking(mx.array(context), logits))
    assert thinking.active and brace in after and hmm not in after
    back = allowed(thinking(mx.array([7, 8]), logits))  # rolled back to the start
    assert thinking.active and brace in back and opener in back and hmm not in back


def test_compiled_state_is_cached(rt: Runtime) -> None:
    compiled = compiled_tokenizer(rt.tokenizer)
    assert compiled_tokenizer(rt.tokenizer) is compiled
    make_processor(rt.tokenizer, JsonSchema({"type": "object", "title": "cache-probe"}))
    count = compiled.cached_grammars()
    make_processor(rt.tokenizer, JsonSchema({"type": "object", "title": "cache-probe"}))
    assert compiled.cached_grammars() == count


# -- validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        (JsonSchema({"type": "foo"}), "Invalid type: foo"),
        (JsonSchema({"properties": {"a": {"$ref": "#/$defs/Nope"}}}), "/$defs/Nope"),
        (JsonSchema({"type": "integer", "minimum": 5, "maximum": 1}), "Unsatisfiable"),
        (
            JsonSchema({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
            "no finite instance: # requires itself",
        ),
        (
            JsonSchema(
                {
                    "$defs": {
                        "n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}
                    },
                    "$ref": "#/$defs/n",
                }
            ),
            "no finite instance: #/$defs/n",
        ),
        (JsonSchema({"type": "string", "pattern": "(["}), "unclosed character class"),
        (JsonSchema({"type": "array", "uniqueItems": True}), "uniqueItems"),
        (JsonSchema({"type": "string", "format": "my-format"}), "Unknown format"),
        (JsonSchema("object"), "must be an object"),  # type: ignore[arg-type]
        (JsonSchema({"default": float("nan")}), "not JSON"),
        (Regex("[a-z"), "unclosed character class"),
        (LarkGrammar("start: foo"), "foo"),
    ],
)
def test_validate_rejects_broken_constraints(constraint: Any, message: str) -> None:
    with pytest.raises(ConstraintError, match=r"invalid|must|not JSON|no finite") as err:
        validate(constraint)
    assert message in str(err.value)


def test_validate_accepts_what_it_can_enforce() -> None:
    validate(JsonSchema(PERSON))
    validate(JsonSchema({"type": "array", "uniqueItems": True}, lenient=True))
    validate(LarkGrammar('start: "a"+'))
    tree = {"$defs": {"t": {"type": "object", "properties": {"kids": {
        "type": "array", "items": {"$ref": "#/$defs/t"}}}, "required": ["kids"]}},
        "$ref": "#/$defs/t"}  # fmt: skip
    validate(JsonSchema(tree))  # recursion that can stop (an empty list) is fine
    validate(JsonSchema({"anyOf": [{"type": "null"}, {"type": "object", "properties": {
        "next": {"$ref": "#"}}, "required": ["next"]}]}))  # fmt: skip
    loose = {"type": "json_schema", "json_schema": {"schema": {"uniqueItems": True}}}
    assert from_response_format(loose) == JsonSchema({"uniqueItems": True}, lenient=True)
    loose["json_schema"]["strict"] = True
    with pytest.raises(ConstraintError, match="uniqueItems"):
        from_response_format(loose)
    assert from_response_format({"type": "text"}) is None
    assert from_response_format(None) is None


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ({"type": "xml"}, "not one of text, json_object, json_schema"),
        ({"type": "json_schema"}, "needs a json_schema object"),
        ({"type": "json_schema", "json_schema": {"schema": []}}, "must be an object"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}, "Invalid type"),
    ],
)
def test_response_format_errors_are_clear(fmt: dict[str, Any], message: str) -> None:
    with pytest.raises(ConstraintError, match=message):
        from_response_format(fmt)


# -- tool choice: schemas and parser -------------------------------------------------


def test_tool_schemas() -> None:
    assert named_tool_schema(TOOLS, "search") == msgspec.json.schema(Search)
    with pytest.raises(ConstraintError, match="'nope', not in tools"):
        named_tool_schema(TOOLS, "nope")
    schema = required_tools_schema(TOOLS, parallel=False)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    items = schema["items"]["anyOf"]
    assert [i["properties"]["name"]["enum"] for i in items] == [["get_weather"], ["search"]]
    assert set(schema["$defs"]) == {"Weather", "Search"}  # hoisted so $ref still resolve
    clash = [
        {"function": {"name": "a", "parameters": {"$defs": {"X": {"type": "string"}}}}},
        {"function": {"name": "b", "parameters": {"$defs": {"X": {"type": "integer"}}}}},
    ]
    with pytest.raises(ConstraintError, match=r"\$defs/X differently"):
        required_tools_schema(clash)
    assert tool_choice_constraint(TOOLS, "auto") is None
    with pytest.raises(ConstraintError, match="needs tools"):
        tool_choice_constraint([], "required")


def test_constrained_tool_call_parser() -> None:
    required = ConstrainedToolCallParser(TOOLS, mode="required")
    first = required.feed('[{"name": "search", "parameters": ')
    out = required.feed('{"query": "x", "limit": 2}}]')
    assert not (first.content or first.tool_calls or out.content or out.tool_calls)
    streamed = "".join(p.arguments for p in [*first.call_parts, *out.call_parts])
    done = required.finish()
    assert [(c.name, json.loads(c.arguments)) for c in done.tool_calls] == [
        ("search", {"query": "x", "limit": 2})
    ]
    assert done.tool_calls[0].arguments.startswith(streamed) and streamed
    named = ConstrainedToolCallParser(TOOLS, mode="named", name="get_weather")
    assert named.parse('{"city": "Oslo", "unit": "celsius"}').tool_calls[0].name == "get_weather"
    truncated = ConstrainedToolCallParser(TOOLS, mode="named", name="get_weather")
    assert truncated.parse('{"city": "Os').content == '{"city": "Os'
    unknown = ConstrainedToolCallParser(TOOLS, mode="required")
    assert unknown.parse('[{"name": "rm", "parameters": {}}]').tool_calls == []


def test_close_objects_leaves_all_of_and_open_schemas_alone() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
        "allOf": [{"properties": {"c": {"type": "integer"}}}],
        "$defs": {"D": {"properties": {"e": {}}, "additionalProperties": True}},
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["allOf"][0]
    assert closed["$defs"]["D"]["additionalProperties"] is True
    assert "additionalProperties" not in schema  # the caller's schema is untouched
