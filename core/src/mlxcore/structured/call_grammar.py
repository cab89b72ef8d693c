"""Tool calls in the model's own markup, as grammars (decision 0023).

A tool parser may declare the grammar of its call format: its classmethod
:meth:`~mlxcore.parsers.base.ToolParser.call_grammar` gets the request's functions and
a :class:`GrammarKit` and returns a :class:`CallFormat`, the text that opens a call
and a rule for what follows it, closer included. The kit knows the tokenizer (a marker
that is one special token is written as that token) and turns argument schemas into
grammar: JSON (:meth:`GrammarKit.json_value`) or text typed by the schema the way the
XML formats are read (:meth:`GrammarKit.text_value`).

From a format :func:`tool_call_grammar` builds, for one request:

* ``tool_choice: auto``: a :class:`LazyToolGrammar`: free text until the model writes
  the opener, then one well-formed call of an offered tool with arguments valid for
  its schema, then free again (:mod:`mlxcore.structured.lazy_tools` enforces it);
* ``required`` or a named function: a :class:`~mlxcore.structured.constraints.LarkGrammar`
  that starts with the opener: one or more calls (one without parallel calls), then
  the end of the output.

A schema the grammar cannot express raises :class:`GrammarUnsupported` with the
reason; the caller then leaves the request unconstrained (and says why in the log).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import llguidance

from mlxcore.parsers.schema_types import schema_types
from mlxcore.structured.constraints import (
    JSON_SEPARATORS,
    LarkGrammar,
    LazyToolGrammar,
    close_objects,
)
from mlxcore.structured.finite import infinite_path

ANNOTATIONS = frozenset(
    {"description", "title", "default", "examples", "deprecated", "readOnly", "writeOnly",
     "$comment", "format", "nullable"}
)  # fmt: skip
"""Schema keywords that do not restrict a value (``format`` is an annotation by default)."""

_REGEX_META = set("\\.^$*+?{}[]|()/")


class GrammarUnsupported(Exception):
    """The tools' schemas (or the format) cannot be written as a call grammar; the
    message says why."""


@attrs.frozen
class Function:
    """One offered function: its name and the JSON schema of its arguments."""

    name: str
    parameters: Mapping[str, Any]


@attrs.frozen
class CallFormat:
    """What a tool parser declares about its call markup.

    Attributes:
        opener: the text that opens a call (``<tool_call>``); the lazy grammar starts
            when the output contains it.
        call: the name of a :class:`GrammarKit` rule for what follows the opener: one
            call (or several, when the format groups them in one block), closer included.
    """

    opener: str
    call: str


@attrs.frozen
class ForcedCalls:
    """The grammar of a ``required`` or named tool choice: calls from the first token."""

    opener: str
    grammar: LarkGrammar


class GrammarKit:
    """Writes the rules of one call grammar (see the module docstring).

    Args:
        special: the token id of a text that the tokenizer has as one special token,
            else ``None``.
        parallel: the request allows more than one call.
    """

    def __init__(self, special: Callable[[str], int | None], *, parallel: bool = True) -> None:
        self.special = special
        self.parallel = parallel
        self._rules: list[str] = []
        self._count = 0

    # -- building blocks --------------------------------------------------------------

    def markup(self, text: str) -> str:
        """``text`` as the special token it is in this tokenizer, else as literal text."""
        token = self.special(text)
        return f"<[{token}]>" if token is not None else self.literal(text)

    @staticmethod
    def literal(text: str) -> str:
        """Exactly ``text`` (never a special token)."""
        return json.dumps(text, ensure_ascii=False)

    def rule(self, body: str, hint: str = "r") -> str:
        """A new rule matching ``body``; returns its name."""
        name = self.reserve(hint)
        self.define(name, body)
        return name

    def reserve(self, hint: str = "r") -> str:
        """A fresh rule name, for a rule that refers to itself (:meth:`define` it later)."""
        self._count += 1
        return f"{hint}_{self._count}"

    def define(self, name: str, body: str) -> None:
        """Write the rule ``name`` (from :meth:`reserve`)."""
        self._rules.append(f"{name}: {body}")

    def terminal(self, body: str, hint: str = "T") -> str:
        """A new terminal (one lexeme: a regex built with ``&`` / ``~``); returns its name."""
        self._count += 1
        name = f"{hint.upper()}_{self._count}"
        self._rules.append(f"{name}: {body}")
        return name

    @staticmethod
    def choice(alternatives: Sequence[str]) -> str:
        """One of ``alternatives`` (grammar expressions)."""
        if len(alternatives) == 1:
            return alternatives[0]
        return "(" + " | ".join(alternatives) + ")"

    def ordered(self, items: Sequence[tuple[str, bool]], separator: str = "") -> str:
        """``items`` in their order, each ``(expression, required)``, optional ones
        present or not, joined by ``separator`` (an expression; ``""`` for none)."""
        sep = f"{separator} " if separator else ""
        nothing = self.literal("")
        first = after = nothing  # the rest from position i: none written yet / some
        for expr, required in reversed(items):
            after_i = self.rule(
                f"{sep}{expr} {after}" if required else f"{sep}{expr} {after} | {after}", "seq"
            )
            first_i = self.rule(
                f"{expr} {after}" if required else f"{expr} {after} | {first}", "seq"
            )
            first, after = first_i, after_i
        return first

    def free_text(
        self, forbidden: Sequence[str] = (), min_chars: int = 0, max_chars: int | None = None
    ) -> str:
        """A terminal for text (newlines included) that contains none of ``forbidden``."""
        count = f"{{{min_chars},{max_chars if max_chars is not None else ''}}}"
        body = f"/(?s:.){count}/" if (min_chars or max_chars is not None) else "/(?s:.*)/"
        if forbidden:
            banned = "|".join(_regex_escape(f) for f in forbidden)
            body += f" & ~/(?s:.*)({banned})(?s:.*)/"
        return self.terminal(body, "text")

    def json_value(self, schema: Any, defs: Mapping[str, Any] | None = None) -> str:
        """A JSON value valid for ``schema`` (objects closed to their listed properties,
        ``", "`` / ``": "`` separators as ``json.dumps`` writes them)."""
        if not isinstance(schema, Mapping):
            schema = {} if schema is True else {"not": {}}
        body = dict(schema)
        if defs and _mentions_ref(body):
            for key, value in defs.items():
                body.setdefault(key, value)
        where = infinite_path(body)
        if where is not None:
            raise GrammarUnsupported(f"{where} requires itself without end")
        body = close_objects(body)
        body["x-guidance"] = {
            "whitespace_flexible": False,
            "item_separator": JSON_SEPARATORS[0],
            "key_separator": JSON_SEPARATORS[1],
        }
        return "%json " + json.dumps(body, ensure_ascii=False)

    def text_value(
        self,
        schema: Any,
        forbidden: Sequence[str],
        closer: str,
        defs: Mapping[str, Any] | None = None,
    ) -> str:
        """A value written as text and typed by its schema the way
        :func:`mlxcore.parsers.schema_types.coerce_text` reads it (the XML formats),
        followed by ``closer`` (literal text): strings as they are (never holding
        ``forbidden``; they end at the first ``closer``), other types as JSON.

        Raises :class:`GrammarUnsupported` for a string with a ``pattern``, a union of a
        string with other types under constraints, or an enum mixing strings and others.
        """
        end = self.literal(closer)
        schema = resolve_ref(schema, defs)
        if not isinstance(schema, Mapping):
            return self.until(self.free_text(forbidden), closer)
        types = schema_types(schema)
        if not types:  # no type information: any text reads as a valid value
            if set(schema) - ANNOTATIONS:
                raise GrammarUnsupported("a parameter with keywords but no type")
            return self.until(self.free_text(forbidden), closer)
        if "string" not in types:
            if types == ["boolean"] and not set(schema) - ANNOTATIONS - {"type"}:
                return f'("true" | "false" | "True" | "False") {end}'  # Jinja's string of a bool
            return f"{self.json_value(schema, defs)} {end}"
        if types != ["string"]:
            if _listed_values(schema) is not None:
                raise GrammarUnsupported("an enum mixing strings and other values")
            if not _plain_types(schema):
                raise GrammarUnsupported("a parameter that may be a string or another type, "
                                         "with constraints")  # fmt: skip
            return self.until(self.free_text(forbidden), closer)
        values = _listed_values(schema)
        if values is not None:
            return f"{self.string_text(schema, forbidden)} {end}"
        return self.until(self.string_text(schema, forbidden), closer)

    def until(self, terminal: str, closer: str) -> str:
        """``terminal`` (a text terminal) then ``closer``: the text ends at the first
        ``closer`` (a lazy lexeme: no ambiguity where a token holds both)."""
        name = self.reserve("value")
        self.define(f"{name}[suffix={self.literal(closer)}]", terminal)
        return name

    def string_text(self, schema: Mapping[str, Any], forbidden: Sequence[str]) -> str:
        """A string parameter written as raw text: one of its ``enum`` / ``const``
        values, or text within its length bounds."""
        values = _listed_values(schema)
        if values is not None:
            if not all(isinstance(v, str) for v in values):
                raise GrammarUnsupported("an enum mixing strings and other values")
            for value in values:
                if any(f in value for f in forbidden) or not value:
                    raise GrammarUnsupported(f"the enum value {value!r} cannot be written raw")
            return self.choice([self.literal(v) for v in values])
        extra = set(schema) - ANNOTATIONS - {"type", "minLength", "maxLength"}
        if extra:
            raise GrammarUnsupported(f"string keywords {sorted(extra)} in a raw-text value")
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
            raise GrammarUnsupported("non-integer string length bounds")
        return self.free_text(forbidden, low, high)

    def tagged_call(
        self,
        fn: Function,
        head: str,
        tail: str,
        opening: Callable[[str], str],
        closer: str,
        forbidden: Sequence[str],
        bad_chars: str = ">",
    ) -> str:
        """A rule for a call written as ``head``, one tagged value per argument
        (``opening(key)``, the value as :meth:`text_value` writes it, ``closer``; in the
        schema's order, the required ones always), then ``tail`` (all literal text).

        Raises :class:`GrammarUnsupported` for a name holding whitespace or ``bad_chars``.
        """
        props, required = object_properties(fn.parameters)
        defs = definitions(fn.parameters)
        items = []
        for key, schema in props:
            _check_tag_name(key, bad_chars)
            value = self.text_value(schema, forbidden, closer, defs)
            items.append((f"{self.literal(opening(key))} {value}", key in required))
        _check_tag_name(fn.name, bad_chars)
        body = f"{self.literal(head)} {self.ordered(items)} {self.literal(tail)}"
        return self.rule(body, "fn")

    # -- the whole grammar ------------------------------------------------------------

    def lark(self, start: str) -> str:
        """The grammar text: ``start: <start>`` and every rule written so far."""
        return "\n".join([f"start: {start}", *self._rules]) + "\n"


ToolChoiceMode = Literal["auto", "required", "named"]


def functions_of(tools: Sequence[Mapping[str, Any]]) -> list[Function]:
    """The request's tools as :class:`Function` (OpenAI ``{type, function}`` or bare)."""
    out = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        out.append(Function(fn["name"], params if isinstance(params, Mapping) else {}))
    return out


def tool_call_grammar(
    declare: Callable[[Sequence[Function], GrammarKit], CallFormat | None],
    tools: Sequence[Mapping[str, Any]],
    special: Callable[[str], int | None],
    *,
    mode: ToolChoiceMode = "auto",
    name: str | None = None,
    parallel: bool = True,
) -> LazyToolGrammar | ForcedCalls | None:
    """The grammar of a request's tool calls in the parser's format.

    Args:
        declare: the parser's ``call_grammar`` classmethod.
        tools: the request's tools.
        special: see :class:`GrammarKit`.
        mode: ``auto`` (lazy), ``required`` or ``named`` (constrained from the start).
        name: the function of a ``named`` choice.
        parallel: more than one call allowed.

    Returns:
        A :class:`LazyToolGrammar` for ``auto``, :class:`ForcedCalls` for the others,
        ``None`` when the parser declares no grammar.

    Raises:
        GrammarUnsupported: a schema (or the format) the grammar cannot express.
    """
    functions = functions_of(tools)
    if name is not None:
        functions = [f for f in functions if f.name == name]
    if not functions:
        raise GrammarUnsupported("no function to call")
    kit = GrammarKit(special, parallel=parallel and mode != "named")
    declared = declare(functions, kit)
    if declared is None:
        return None
    if mode == "auto":
        text = kit.lark(declared.call)
        _check(text)
        return LazyToolGrammar(declared.opener, text, parallel)
    one = f"{kit.markup(declared.opener)} {declared.call}"
    more = f' ("\\n"? {one})*' if kit.parallel else ""
    text = kit.lark(one + more)
    _check(text)
    return ForcedCalls(declared.opener, LarkGrammar(text))


@functools.lru_cache(maxsize=256)
def _check(text: str) -> None:
    error = llguidance.LLMatcher.validate_grammar(text)
    if error:
        raise GrammarUnsupported(f"the call grammar does not compile: {error.strip()[:300]}")


def special_token_finder(
    tokenizer: Any, is_special: Callable[[int], bool]
) -> Callable[[str], int | None]:
    """``special`` for :class:`GrammarKit`: the id of a text the tokenizer encodes as one
    special token."""

    def special(text: str) -> int | None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return int(ids[0]) if len(ids) == 1 and is_special(int(ids[0])) else None

    return special


def resolve_ref(schema: Any, defs: Mapping[str, Any] | None, depth: int = 0) -> Any:
    """``schema`` with a local ``$ref`` (``#/$defs/X`` or ``#/definitions/X``) at its top
    replaced by what it names (siblings kept)."""
    if not isinstance(schema, Mapping) or "$ref" not in schema:
        return schema
    ref = schema["$ref"]
    prefix = next(
        (p for p in ("#/$defs/", "#/definitions/") if isinstance(ref, str) and ref.startswith(p)),
        None,
    )
    if prefix is None or depth > 8 or not defs:
        raise GrammarUnsupported(f"the reference {ref!r} cannot be followed")
    key = prefix[2:-1]
    table = defs.get(key)
    target = table.get(ref[len(prefix) :]) if isinstance(table, Mapping) else None
    if not isinstance(target, Mapping):
        raise GrammarUnsupported(f"the reference {ref!r} names nothing")
    merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return resolve_ref(merged, defs, depth + 1)


def definitions(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The ``$defs`` / ``definitions`` of a parameters schema, for references inside it."""
    return {
        k: parameters[k] for k in ("$defs", "definitions") if isinstance(parameters.get(k), Mapping)
    }


def object_properties(parameters: Mapping[str, Any]) -> tuple[list[tuple[str, Any]], set[str]]:
    """The properties (in order) and the required names of a function's parameters,
    for formats that write each argument on its own; refuses what they cannot show."""
    parameters = resolve_ref(parameters, definitions(parameters))
    allowed = ANNOTATIONS | {"type", "properties", "required", "additionalProperties",
                             "$defs", "definitions", "$schema", "strict"}  # fmt: skip
    extra = set(parameters) - allowed
    if extra:
        raise GrammarUnsupported(f"parameters with {sorted(extra)} at the top")
    if parameters.get("type", "object") != "object":
        raise GrammarUnsupported("parameters that are not an object")
    props = parameters.get("properties") or {}
    required = parameters.get("required") or []
    if not isinstance(props, Mapping) or not isinstance(required, list):
        raise GrammarUnsupported("malformed properties or required")
    missing = [r for r in required if r not in props]
    if missing:
        raise GrammarUnsupported(f"required arguments {missing} without a schema")
    return list(props.items()), set(required)


def _check_tag_name(name: str, bad_chars: str) -> None:
    if not name or any(c.isspace() or c in bad_chars for c in name):
        raise GrammarUnsupported(f"the name {name!r} cannot be written in the call markup")


def _listed_values(schema: Mapping[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    return None


def _plain_types(schema: Any, depth: int = 0) -> bool:
    """Only types (and annotations), possibly as a union: any text reads as valid."""
    if not isinstance(schema, Mapping) or depth > 4:
        return False
    for key, value in schema.items():
        if key in ANNOTATIONS or key == "type":
            continue
        plain = isinstance(value, list) and all(_plain_types(v, depth + 1) for v in value)
        if key in ("anyOf", "oneOf") and plain:
            continue
        return False
    return True


def _mentions_ref(node: Any) -> bool:
    if isinstance(node, Mapping):
        return "$ref" in node or any(_mentions_ref(v) for v in node.values())
    if isinstance(node, list):
        return any(_mentions_ref(v) for v in node)
    return False


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)
