"""User grammars (vLLM's ``structured_outputs`` / ``guided_*``, ``response_format``
grammar types) constrain real output on three model families (Qwen3, the hybrid Qwen3.5
and Gemma 4, whose tokenizer is SentencePiece), greedy and sampled.

The random weights write garbage unconstrained; every output below is parsed or matched,
so output that fits shows the constraint at work."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxcore.engine.events import FinishEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.runtime import Runtime
from mlxcore.structured import (
    OPTION,
    Choice,
    ConstraintError,
    LarkGrammar,
    Regex,
    from_response_format,
    structured_outputs_constraint,
)
from mlxcore.testing.runtime import make_runtime, submit_together

SAMPLINGS = [
    pytest.param(SamplingParams(), id="greedy"),
    pytest.param(SamplingParams(temperature=1.0, seed=11), id="sampled"),
]

REGEX = r"(yes|no), [0-9]{2,4}!"
CHOICES = ["red", "green", "blue sky", "naïve café"]
LARK = """
start: "[" item ("," item){0,3} "]"
item: pair | NUMBER
pair: "(" NUMBER " " NUMBER ")"
NUMBER: /[0-9]{1,3}/
"""
GBNF = 'root ::= "Answer: " ("A" | "B" | "C") ". Because " [a-z]{1,8} "."'
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["colour", "count", "ok"],
}


def _lark_tree(text: str) -> bool:
    """A hand-written reader of the language of :data:`LARK`."""
    number, pair = r"[0-9]{1,3}", r"\([0-9]{1,3} [0-9]{1,3}\)"
    item = f"(?:{pair}|{number})"
    return re.fullmatch(rf"\[{item}(?:,{item}){{0,3}}\]", text) is not None


CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("regex", {"guided_regex": REGEX}, lambda t: re.fullmatch(REGEX, t)),
    ("choice", {"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
    ("lark", {"guided_grammar": LARK}, _lark_tree),
    ("gbnf", {"structured_outputs": {"grammar": GBNF}}, lambda t: re.fullmatch(
        r"Answer: [ABC]\. Because [a-z]{1,8}\.", t)),
    ("json", {"structured_outputs": {"json": SCHEMA}}, lambda t: (
        (v := json.loads(t))["colour"] in ("red", "green") and 0 <= v["count"] <= 99
        and isinstance(v["ok"], bool) and set(v) == {"colour", "count", "ok"})),
]  # fmt: skip


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5", "gemma4"])
def rt(
    request: pytest.FixtureRequest, tiny_qwen3: Path, tiny_qwen3_5: Path, tiny_gemma4: Path
) -> Iterator[Runtime]:
    folder = {"qwen3": tiny_qwen3, "qwen3_5": tiny_qwen3_5, "gemma4": tiny_gemma4}[request.param]
    runtime = make_runtime(folder)
    yield runtime
    runtime.engine.shutdown()


def run_all(rt: Runtime, requests: list[GenerationRequest]) -> list[tuple[str, FinishEvent]]:
    """Every request in one batch: its text (end of sequence left out) and finish."""
    out = []
    for res in submit_together(rt, requests):
        assert res.finish is not None
        kept = [t for t in res.tokens if t not in rt.info.eos_token_ids]
        out.append((rt.tokenizer.decode(kept), res.finish))
    return out


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_every_grammar_kind_constrains_the_output(rt: Runtime, sampling: SamplingParams) -> None:
    """All five kinds in one batch: each output is complete and in its language."""
    requests, checks = [], []
    for name, fields, check in CASES:
        found = structured_outputs_constraint(**fields)
        assert found is not None, name
        prompt = tuple(rt.tokenizer.encode(f"Write {name}:"))
        requests.append(GenerationRequest(prompt, 80, sampling, options={OPTION: found[0]}))
        checks.append((name, check))
    for (name, check), (text, finish) in zip(checks, run_all(rt, requests), strict=True):
        assert finish.reason == "stop", (name, finish, text)
        assert check(text), (name, text)


def test_response_format_grammar_shapes() -> None:
    assert from_response_format({"type": "grammar", "grammar": LARK}) == LarkGrammar(LARK)
    openai_shape = {"type": "grammar", "grammar": {"syntax": "regex", "definition": REGEX}}
    assert from_response_format(openai_shape) == Regex(REGEX)
    assert from_response_format({"type": "regex", "regex": REGEX}) == Regex(REGEX)
    assert structured_outputs_constraint(guided_choice=["a", "b"]) == (
        Choice(("a", "b")),
        "guided_choice",
    )
    assert structured_outputs_constraint({"json_object": False}) is None
    assert structured_outputs_constraint(None) is None


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"guided_regex": "[a-"}, "guided_regex", "unclosed character class"),
        ({"structured_outputs": {"regex": "(x"}}, "structured_outputs.regex", "unclosed"),
        ({"guided_grammar": "root ::= ("}, "guided_grammar", "invalid grammar"),
        ({"guided_grammar": "start: nope"}, "guided_grammar", "unknown name"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "at least one"),
        ({"guided_choice": ["a", ""]}, "guided_choice", "non-empty"),
        ({"structured_outputs": {"choice": "a"}}, "structured_outputs.choice", "list of strings"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_json": {"type": "foo"}}, "guided_json", "Invalid type"),
        ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object", "true"),
        ({"structured_outputs": []}, "structured_outputs", "must be an object"),
        (
            {"guided_regex": "a", "structured_outputs": {"choice": ["b"]}},
            "guided_regex",
            "not several",
        ),
    ],
)
def test_bad_user_grammars_name_their_field(
    fields: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ConstraintError, match=re.escape(message)) as err:
        structured_outputs_constraint(**fields)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ({"type": "grammar"}, "must be a grammar"),
        ({"type": "grammar", "grammar": {"syntax": "peg", "definition": "x"}}, "syntax 'peg'"),
        ({"type": "regex", "regex": "[z-a]"}, "invalid regex"),
    ],
)
def test_bad_response_format_grammars(fmt: dict[str, Any], message: str) -> None:
    with pytest.raises(ConstraintError, match=re.escape(message)) as err:
        from_response_format(fmt)
    assert (err.value.field or "").startswith("response_format")
