"""What a constrained request must produce: JSON (free-form or by schema), a regex, a grammar.

A constraint is plain, immutable data that a front end builds from a request body
(:func:`mlxcore.structured.requested.from_response_format` does it for OpenAI's
``response_format``) and puts in
``GenerationRequest.options["constraint"]``. :func:`validate` checks it without a
model, so a bad schema is answered with a 400 before the request reaches the engine.
The grammar text each constraint compiles to is llguidance's (see
docs/decisions/0002-constrained-decoding.md).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from mlxcore.structured.finite import infinite_path

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

MAX_SCHEMA_CHARS = 200_000
"""Schemas (and grammars) longer than this, as JSON text, are refused."""

JSON_SEPARATORS = (", ", ": ")
"""Item and key separators of generated JSON: ``json.dumps``'s defaults, one line."""


class ConstraintError(ValueError):
    """A constraint that cannot be used (bad schema, unsupported keyword, bad regex).

    The message names what is wrong; front ends answer it with HTTP 400, naming
    :attr:`field` when it is set (e.g. ``tools[2].function.parameters``).
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@attrs.frozen
class JsonObject:
    """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""

    def describe(self) -> str:
        """A short name for error messages."""
        return "JSON object constraint"


@attrs.frozen
class JsonSchema:
    """JSON that validates against ``schema`` (OpenAI's ``json_schema`` response format).

    Attributes:
        schema: the JSON schema (a dict; never mutated).
        extra_properties: when ``False`` (the default), an object schema that lists
            ``properties`` and says nothing about others gets no others, as in OpenAI's
            strict mode; output then still validates against the schema as written.
        lenient: ignore schema keywords the matcher cannot enforce (``uniqueItems``,
            ``not``, ``if``...) instead of refusing the schema.
    """

    schema: Mapping[str, Any]
    extra_properties: bool = False
    lenient: bool = False

    def describe(self) -> str:
        """A short name for error messages."""
        title = self.schema.get("title") if isinstance(self.schema, Mapping) else None
        return f"JSON schema {title!r}" if isinstance(title, str) else "JSON schema"


@attrs.frozen
class Regex:
    """Text matching a regular expression (Rust ``regex`` syntax, anchored at both ends)."""

    pattern: str

    def describe(self) -> str:
        """A short name for error messages."""
        return "regex constraint"


@attrs.frozen
class LarkGrammar:
    """Text in the language of a grammar: llguidance's Lark dialect (``start`` rule), or
    llama.cpp's GBNF / EBNF (``root ::= ...``), told apart by their syntax."""

    grammar: str

    def describe(self) -> str:
        """A short name for error messages."""
        return "grammar constraint"


@attrs.frozen
class Choice:
    """Exactly one of the given strings (vLLM's ``choice``)."""

    options: tuple[str, ...]

    def describe(self) -> str:
        """A short name for error messages."""
        return "choice constraint"


@attrs.frozen
class LazyToolGrammar:
    """A constraint that holds only inside tool calls (``tool_choice: auto``).

    Attributes:
        opener: the text that starts a call.
        grammar: llguidance Lark whose ``start`` is what follows the opener.
        parallel: more than one call allowed.
        in_reasoning: whether an opener inside unclosed reasoning starts a call (the
            reasoning parser then ends the reasoning there): ``"anywhere"``, ``"line"``
            (at the start of a line), or ``None`` (never: calls follow the reasoning).
    """

    opener: str
    grammar: str
    parallel: bool = True
    in_reasoning: str | None = None

    def describe(self) -> str:
        """A short name for error messages."""
        return "tool-call grammar"


Constraint: TypeAlias = JsonObject | JsonSchema | Regex | LarkGrammar | Choice | LazyToolGrammar
"""Every kind of constraint a request can carry."""


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar for ``constraint`` (memoised for schema texts seen recently).

    Raises :class:`ConstraintError` when the constraint is malformed; see :func:`validate`
    for the full check.
    """
    if isinstance(constraint, JsonObject):
        return _json_grammar('{"type": "object"}', False)
    if isinstance(constraint, JsonSchema):
        return _json_grammar(_schema_text(constraint), constraint.lenient)
    if isinstance(constraint, Regex):
        _check_text("regex pattern", constraint.pattern)
        return str(llguidance.LLMatcher.grammar_from_regex(constraint.pattern))
    if isinstance(constraint, LarkGrammar):
        _check_text("grammar", constraint.grammar)
        return _lark_grammar(constraint.grammar)
    if isinstance(constraint, Choice):
        return _choice_grammar(constraint.options)
    if isinstance(constraint, LazyToolGrammar):
        return _lark_grammar(constraint.grammar)
    raise ConstraintError(f"unknown constraint type {type(constraint).__name__}")


def validate(constraint: Constraint) -> None:
    """Check that ``constraint`` can be enforced; raise :class:`ConstraintError` if not.

    Cheap (no model, no tokenizer: a few milliseconds for a large schema), so front ends
    call it before submitting and answer the error with a 400.
    """
    _validated(grammar_text(constraint), constraint.describe())


@functools.lru_cache(maxsize=256)
def _validated(grammar: str, what: str) -> None:
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ConstraintError(f"invalid {what}: {error.strip()}")


# -- helpers -------------------------------------------------------------------


MAX_CHOICES = 4096
"""Most strings a choice constraint may list."""


@functools.lru_cache(maxsize=256)
def _lark_grammar(text: str) -> str:
    """Lark as it is; a GBNF / EBNF grammar converted to Lark first."""
    try:
        lark = any_to_lark(text)
    except Exception as exc:  # the converter raises bare exceptions on bad GBNF
        raise ConstraintError(f"invalid grammar: {exc}") from None
    try:
        return str(llguidance.LLMatcher.grammar_from_lark(lark))
    except ValueError as exc:
        raise ConstraintError(f"invalid grammar: {exc}") from None


def _choice_grammar(options: tuple[str, ...]) -> str:
    if not options:
        raise ConstraintError("a choice needs at least one string")
    if len(options) > MAX_CHOICES:
        raise ConstraintError(f"at most {MAX_CHOICES} choices, got {len(options)}")
    if not all(isinstance(o, str) and o for o in options):
        raise ConstraintError("every choice must be a non-empty string")
    _check_text("choice list", "".join(options))
    alternatives = " | ".join(json.dumps(o, ensure_ascii=False) for o in dict.fromkeys(options))
    return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}"))


def _check_text(what: str, text: Any) -> None:
    if not isinstance(text, str) or not text:
        raise ConstraintError(f"the {what} must be a non-empty string")
    if len(text) > MAX_SCHEMA_CHARS:
        raise ConstraintError(f"the {what} is too long ({len(text)} > {MAX_SCHEMA_CHARS} chars)")


def _schema_text(constraint: JsonSchema) -> str:
    schema = constraint.schema
    if not isinstance(schema, Mapping):
        raise ConstraintError(f"a JSON schema must be an object, got {type(schema).__name__}")
    where = infinite_path(schema)
    if where is not None:
        raise ConstraintError(
            f"the JSON schema has no finite instance: {where} requires itself without end "
            "(let the recursion stop: make that property optional, or allow an empty array)"
        )
    if not constraint.extra_properties:
        schema = close_objects(schema)
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConstraintError(f"the JSON schema is not JSON: {exc}") from None
    _check_text("JSON schema", text)
    return text


@functools.lru_cache(maxsize=256)
def _json_grammar(schema_text: str, lenient: bool) -> str:
    options: JsonCompileOptions = {
        "whitespace_flexible": False,
        "item_separator": JSON_SEPARATORS[0],
        "key_separator": JSON_SEPARATORS[1],
        "lenient": lenient,
    }
    try:
        return str(llguidance.LLMatcher.grammar_from_json_schema(schema_text, overrides=options))
    except ValueError as exc:
        raise ConstraintError(f"invalid JSON schema: {exc}") from None


_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "contains", "propertyNames")
_OPENNESS_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_objects(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` where object schemas with ``properties`` allow no others.

    Only schemas that say nothing about other properties are closed, and nothing under
    ``allOf`` is touched (closing its branches would make their union unsatisfiable).
    """
    out = copy.deepcopy(dict(schema))
    _close(out)
    return out


def _close(node: Any) -> None:
    if not isinstance(node, dict):
        return
    if isinstance(node.get("properties"), dict) and not any(k in node for k in _OPENNESS_KEYS):
        node["additionalProperties"] = False
    for key in _SUBSCHEMA_MAPS:
        children = node.get(key)
        if isinstance(children, dict):
            for child in children.values():
                _close(child)
    for key in _SUBSCHEMA_LISTS:
        children = node.get(key)
        if isinstance(children, list):
            for child in children:
                _close(child)
    for key in _SUBSCHEMA_ONE:
        _close(node.get(key))
