"""Gemma 4's call syntax as a grammar, for constrained tool calls (decision 0023).

What :mod:`mlxcore_gemma4.values` reads, restricted to what the official template
writes and to one function's argument schema: ``call:NAME{key:VALUE,...}`` with bare
keys (``<|"|>``-quoted where a key is not a plain word), strings between two
``<|"|>`` tokens, bare numbers, ``true`` / ``false`` / ``null``, nested objects and
arrays; the properties of an object sorted by name (the template's ``dictsort``), the
required ones always.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxcore.structured.call_grammar import (
    ANNOTATIONS,
    GrammarKit,
    GrammarUnsupported,
    definitions,
    resolve_ref,
)

_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_INTEGER = r"/-?(0|[1-9][0-9]*)/"
_NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"
_NUMERIC = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_OBJECT = ("properties", "required", "additionalProperties")
_ARRAY = ("items", "minItems", "maxItems")
_STRING = ("minLength", "maxLength", "pattern")
_MAX_DEPTH = 16


class GemmaValues:
    """Writes grammar rules for values of JSON schemas in Gemma 4's syntax.

    Args:
        kit: the grammar being written.
        quote: the string marker (``<|"|>``).
        forbidden: text a string may not hold (markup the parser would act on).
        defs: ``$defs`` / ``definitions`` for references.
    """

    def __init__(
        self,
        kit: GrammarKit,
        quote: str,
        forbidden: Sequence[str],
        defs: Mapping[str, Any] | None = None,
    ) -> None:
        self.kit = kit
        self.quote_text = quote
        self.quote = kit.markup(quote)
        self.forbidden = tuple(forbidden)
        self.defs = defs or {}
        self._any: str | None = None
        self._text: str | None = None

    def arguments(self, parameters: Mapping[str, Any]) -> str:
        """The ``{...}`` of a call to a function with these ``parameters``."""
        self.defs = definitions(parameters)
        body = {k: v for k, v in parameters.items() if k not in ("$defs", "definitions")}
        body.setdefault("type", "object")
        return self.value(body)

    def value(self, schema: Any, depth: int = 0) -> str:
        """A value valid for ``schema``."""
        if depth > _MAX_DEPTH:
            raise GrammarUnsupported("the schema nests too deep")
        schema = resolve_ref(schema, self.defs)
        if schema is True or (isinstance(schema, Mapping) and not set(schema) - ANNOTATIONS):
            return self.any_value()
        if not isinstance(schema, Mapping):
            raise GrammarUnsupported("a schema that allows nothing")
        if "const" in schema or isinstance(schema.get("enum"), list):
            listed = [schema["const"]] if "const" in schema else schema["enum"]
            return self.kit.choice([self.literal(v) for v in listed])
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                if set(schema) - ANNOTATIONS - {key}:
                    raise GrammarUnsupported(f"{key} beside other keywords")
                return self.kit.choice([self.value(s, depth + 1) for s in schema[key]])
        extra = set(schema) - ANNOTATIONS - {"type", *_NUMERIC, *_OBJECT, *_ARRAY, *_STRING}
        if extra:
            raise GrammarUnsupported(f"schema keywords {sorted(extra)}")
        kind = schema.get("type")
        kinds = kind if isinstance(kind, list) else [kind] if kind else []
        if not kinds:
            kinds = ["object"] if "properties" in schema else ["array"] if "items" in schema else []
        if not kinds:
            return self.any_value()
        return self.kit.choice([self._typed(str(k), schema, depth) for k in kinds])

    def _typed(self, kind: str, schema: Mapping[str, Any], depth: int) -> str:
        if kind == "string":
            sub = {k: schema[k] for k in _STRING if k in schema}
            return f"{self.quote} {self.kit.string_text(sub, self.forbidden)} {self.quote}"
        if kind in ("integer", "number"):
            bounds = {k: schema[k] for k in _NUMERIC if k in schema}
            if bounds:
                return self.kit.json_value({"type": kind, **bounds})
            return self.kit.terminal(_INTEGER if kind == "integer" else _NUMBER, "num")
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        raise GrammarUnsupported(f"the type {kind!r}")

    def _object(self, schema: Mapping[str, Any], depth: int) -> str:
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        if not isinstance(props, Mapping) or (props and not required <= set(props)):
            raise GrammarUnsupported("required properties without a schema")
        if not props:
            extra = schema.get("additionalProperties", True)
            if extra is False:
                return '"{" "}"'
            pair = f'{self._any_key()} ":" {self.value(extra, depth + 1)}'
            return f'"{{" ({pair} ("," {pair})*)? "}}"'
        items = [  # in key order: the template writes every object with ``dictsort``
            (f'{self.key(k)} ":" {self.value(s, depth + 1)}', k in required)
            for k, s in sorted(props.items())
        ]
        return f'"{{" {self.kit.ordered(items, chr(34) + "," + chr(34))} "}}"'

    def _array(self, schema: Mapping[str, Any], depth: int) -> str:
        item = self.value(schema.get("items", True), depth + 1)
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if not isinstance(low, int) or (high is not None and not isinstance(high, int)):
            raise GrammarUnsupported("non-integer array bounds")
        if high == 0:
            return '"[" "]"'
        repeat = f"{{{max(low - 1, 0)},{high - 1 if high is not None else ''}}}"
        some = f'{item} ("," {item}){repeat}'
        return f'"[" {some} "]"' if low > 0 else f'"[" ({some})? "]"'

    def key(self, name: str) -> str:
        """An object key as the template writes it: bare, or quoted when not a word."""
        if _BARE_KEY.fullmatch(name):
            return self.kit.literal(name)
        if any(f in name for f in self.forbidden):
            raise GrammarUnsupported(f"the key {name!r} cannot be written")
        return f"{self.quote} {self.kit.literal(name)} {self.quote}"

    def literal(self, value: Any) -> str:
        """Exactly ``value`` in Gemma 4's syntax."""
        if isinstance(value, str):
            if any(f in value for f in self.forbidden):
                raise GrammarUnsupported(f"the value {value!r} cannot be written")
            inner = f" {self.kit.literal(value)} " if value else " "
            return f"{self.quote}{inner}{self.quote}"
        if isinstance(value, bool) or value is None or isinstance(value, int | float):
            return self.kit.literal(json.dumps(value))
        if isinstance(value, Mapping):
            pairs = [f'{self.key(str(k))} ":" {self.literal(v)}' for k, v in sorted(value.items())]
            return '"{" ' + ' "," '.join(pairs) + ' "}"' if pairs else '"{" "}"'
        if isinstance(value, list):
            parts = [self.literal(v) for v in value]
            return '"[" ' + ' "," '.join(parts) + ' "]"' if parts else '"[" "]"'
        raise GrammarUnsupported(f"the value {value!r}")

    def any_value(self) -> str:
        """Any value (a schema without constraints)."""
        if self._any is None:
            self._any = name = self.kit.reserve("anyvalue")
            text = self.kit.free_text(self.forbidden)
            pair = f'{self._any_key()} ":" {name}'
            self.kit.define(
                name,
                f"{self.quote} {text} {self.quote} | {self.kit.terminal(_NUMBER, 'num')}"
                f' | "true" | "false" | "null" | "{{" ({pair} ("," {pair})*)? "}}"'
                f' | "[" ({name} ("," {name})*)? "]"',
            )
        return self._any

    def _any_key(self) -> str:
        return self.kit.terminal(r"/[A-Za-z_][A-Za-z0-9_]*/", "key")
