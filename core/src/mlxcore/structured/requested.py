"""What clients ask the output to be, parsed into constraints: OpenAI's
``response_format`` (:func:`from_response_format`), vLLM's ``structured_outputs`` object,
its older ``guided_*`` fields, and ``response_format`` types beyond OpenAI's JSON ones.

* ``structured_outputs``: ``{"json": schema}``, ``{"regex": pattern}``, ``{"choice":
  [strings]}``, ``{"grammar": lark_or_gbnf}`` or ``{"json_object": true}``, one of them;
* ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``: the same, as
  top-level fields (vLLM before 0.11, still sent by many clients);
* ``response_format``: ``{"type": "grammar", "grammar": text}`` (also OpenAI's custom-tool
  shape ``"grammar": {"syntax": "lark" | "regex", "definition": text}``) and ``{"type":
  "regex", "regex": pattern}``.

Every function returns a validated :data:`~mlxcore.structured.constraints.Constraint` and
raises :class:`~mlxcore.structured.constraints.ConstraintError` naming the field at
fault, so a request is refused with a 400 before it reaches the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mlxcore.structured.constraints import (
    Choice,
    Constraint,
    ConstraintError,
    JsonObject,
    JsonSchema,
    LarkGrammar,
    Regex,
    validate,
)

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
"""vLLM's older per-kind fields, each the same as one key of ``structured_outputs``."""

STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
"""The keys of ``structured_outputs`` that say what the output must be."""


def _kind_constraint(kind: str, value: Any, field: str) -> Constraint | None:
    """The constraint of one ``structured_outputs`` key (``None``: ``json_object: false``)."""
    try:
        if kind == "json":
            if isinstance(value, str):  # vLLM takes the schema as JSON text too
                value = json.loads(value)
            if not isinstance(value, Mapping):
                raise ConstraintError("must be a JSON schema (an object, or its JSON text)")
            constraint: Constraint = JsonSchema(value, lenient=True)
        elif kind == "json_object":
            if not isinstance(value, bool):
                raise ConstraintError("must be true or false")
            if not value:
                return None
            constraint = JsonObject()
        elif kind == "regex":
            if not isinstance(value, str):
                raise ConstraintError("must be a regular expression (a string)")
            constraint = Regex(value)
        elif kind == "choice":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConstraintError("must be a list of strings")
            constraint = Choice(tuple(value))
        else:
            if not isinstance(value, str):
                raise ConstraintError("must be a grammar (Lark or GBNF text)")
            constraint = LarkGrammar(value)
        validate(constraint)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"{field}: not valid JSON: {exc}", field) from None
    except ConstraintError as exc:
        raise ConstraintError(f"{field}: {exc}" if not exc.field else str(exc), field) from None
    return constraint


def structured_outputs_constraint(
    structured_outputs: Mapping[str, Any] | None = None, **guided: Any
) -> tuple[Constraint, str] | None:
    """The constraint of vLLM's ``structured_outputs`` object or ``guided_*`` fields
    (given as keyword arguments), with the field it came from; ``None`` when the request
    asks for none. Two kinds at once are refused."""
    asked: list[tuple[str, str, Any]] = []  # (kind, field, value)
    if structured_outputs is not None:
        if not isinstance(structured_outputs, Mapping):
            raise ConstraintError("structured_outputs must be an object", "structured_outputs")
        for kind in STRUCTURED_KINDS:
            if structured_outputs.get(kind) is not None:
                asked.append((kind, f"structured_outputs.{kind}", structured_outputs[kind]))
    for name in GUIDED_FIELDS:
        if guided.get(name) is not None:
            asked.append((name.removeprefix("guided_"), name, guided[name]))
    asked = [a for a in asked if not (a[0] == "json_object" and a[2] is False)]
    if not asked:
        return None
    if len(asked) > 1:
        fields = ", ".join(field for _, field, _ in asked)
        raise ConstraintError(f"give one output constraint, not several ({fields})", asked[1][1])
    kind, field, value = asked[0]
    constraint = _kind_constraint(kind, value, field)
    return None if constraint is None else (constraint, field)


def grammar_response_format(fmt: Mapping[str, Any]) -> Constraint:
    """The constraint of ``response_format`` ``{"type": "grammar" | "regex", ...}``."""
    if fmt.get("type") == "regex":
        pattern = fmt.get("regex", fmt.get("pattern"))
        return _required("regex", pattern, "response_format.regex")
    grammar = fmt.get("grammar")
    if isinstance(grammar, Mapping):  # OpenAI's custom-tool format
        syntax, definition = grammar.get("syntax", "lark"), grammar.get("definition")
        if syntax not in ("lark", "regex", "gbnf", "ebnf"):
            raise ConstraintError(
                f"grammar syntax {syntax!r} is not one of lark, regex, gbnf, ebnf",
                "response_format.grammar.syntax",
            )
        kind = "regex" if syntax == "regex" else "grammar"
        return _required(kind, definition, "response_format.grammar.definition")
    return _required("grammar", grammar, "response_format.grammar")


def _required(kind: str, value: Any, field: str) -> Constraint:
    constraint = _kind_constraint(kind, value, field)
    assert constraint is not None, "only json_object: false asks for nothing"
    return constraint


def from_response_format(fmt: Mapping[str, Any] | None) -> Constraint | None:
    """The constraint for an OpenAI ``response_format`` value (``None`` for plain text).

    Accepts ``{"type": "text"}``, ``{"type": "json_object"}``,
    ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`` and the
    grammar types of :mod:`mlxcore.structured.requested`; a
    ``json_schema`` without ``schema`` means any JSON object. The schema is always
    enforced; ``"strict": true`` also refuses keywords that cannot be enforced (without
    it they are ignored, see :attr:`JsonSchema.lenient`). The result is validated.

    Raises:
        ConstraintError: an unknown type, a malformed body or an unusable schema.
    """
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise ConstraintError("response_format must be an object")
    kind = fmt.get("type")
    constraint: Constraint
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        constraint = JsonObject()
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ConstraintError("response_format json_schema needs a json_schema object")
        schema = spec.get("schema")
        if schema is None:
            constraint = JsonObject()
        elif isinstance(schema, Mapping):
            constraint = JsonSchema(schema, lenient=spec.get("strict") is not True)
        else:
            raise ConstraintError("response_format json_schema.schema must be an object")
    elif kind in ("grammar", "regex"):
        return grammar_response_format(fmt)
    else:
        raise ConstraintError(
            f"response_format type {kind!r} is not one of text, json_object, json_schema, "
            "grammar, regex"
        )
    validate(constraint)
    return constraint
