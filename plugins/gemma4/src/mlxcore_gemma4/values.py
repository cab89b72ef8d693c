"""Gemma 4's call syntax: ``call:NAME{key:VALUE,...}`` with ``<|"|>`` strings.

What the official template (google-gemma-4-31B-it.jinja, ``format_argument``)
writes for each argument value:

* strings between two ``<|"|>`` markers, verbatim (no escapes: quotes, braces,
  commas and newlines inside are text);
* numbers and ``true`` / ``false`` bare; ``null`` (``None``) bare;
* objects as ``{key:VALUE,...}`` with bare keys, arrays as ``[VALUE,...]``.

Also accepted, because models drift: keys in ``<|"|>`` or JSON quotes, JSON
``"..."`` strings, whitespace anywhere between tokens, a trailing comma, and a
bare word (``unit:celsius``) read as a string. Names may be namespaced
(``google:mcp:create``): the name is everything between ``call:`` and ``{``.
"""

from __future__ import annotations

import json
import re
from typing import Any

QUOTE = '<|"|>'
CALL = "call:"
_NUMBER = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
_BARE_END = ",}]"
_MAX_DEPTH = 64
_STRING = json.JSONDecoder(strict=False)


class GemmaSyntaxError(ValueError):
    """The text is not valid Gemma 4 call syntax."""


def parse_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """Every ``call:NAME{...}`` in ``text`` (the body of one ``<|tool_call>`` block).

    ``None`` when the text is not one or more well-formed calls.
    """
    calls = []
    pos = _skip(text, 0)
    try:
        while pos < len(text):
            name, args, pos = parse_call(text, pos)
            calls.append((name, args))
            pos = _skip(text, pos)
    except GemmaSyntaxError:
        return None
    return calls or None


def parse_call(text: str, pos: int = 0) -> tuple[str, dict[str, Any], int]:
    """One ``call:NAME{...}`` starting at ``pos``: (name, arguments, end offset)."""
    if not text.startswith(CALL, pos):
        raise GemmaSyntaxError(f"expected 'call:' at {pos}")
    brace = text.find("{", pos)
    if brace < 0:
        raise GemmaSyntaxError("call without arguments")
    name = text[pos + len(CALL) : brace].strip()
    if not name or any(c.isspace() for c in name):
        raise GemmaSyntaxError(f"bad function name {name!r}")
    args, end = parse_value(text, brace)
    if not isinstance(args, dict):
        raise GemmaSyntaxError("arguments are not an object")
    return name, args, end


def parse_value(text: str, pos: int, depth: int = 0) -> tuple[Any, int]:
    """The value starting at ``pos`` (after whitespace): (value, end offset)."""
    if depth > _MAX_DEPTH:
        raise GemmaSyntaxError("nested too deep")
    pos = _skip(text, pos)
    if pos >= len(text):
        raise GemmaSyntaxError("value expected")
    ch = text[pos]
    if ch == "{":
        return _object(text, pos + 1, depth)
    if ch == "[":
        return _array(text, pos + 1, depth)
    if text.startswith(QUOTE, pos):
        return _raw_string(text, pos)
    if ch == '"':
        return _json_string(text, pos)
    return _bare(text, pos)


def _object(text: str, pos: int, depth: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while True:
        pos = _skip(text, pos)
        if text.startswith("}", pos):
            return out, pos + 1
        key, pos = _key(text, pos)
        pos = _skip(text, pos)
        if not text.startswith(":", pos):
            raise GemmaSyntaxError(f"':' expected after key {key!r}")
        out[key], pos = parse_value(text, pos + 1, depth + 1)
        pos = _after_item(text, pos, "}")


def _array(text: str, pos: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while True:
        pos = _skip(text, pos)
        if text.startswith("]", pos):
            return out, pos + 1
        value, pos = parse_value(text, pos, depth + 1)
        out.append(value)
        pos = _after_item(text, pos, "]")


def _after_item(text: str, pos: int, close: str) -> int:
    pos = _skip(text, pos)
    if text.startswith(",", pos):
        return pos + 1
    if text.startswith(close, pos):
        return pos
    raise GemmaSyntaxError(f"',' or '{close}' expected at {pos}")


def _key(text: str, pos: int) -> tuple[str, int]:
    if text.startswith(QUOTE, pos):
        return _raw_string(text, pos)
    if text.startswith('"', pos):
        return _json_string(text, pos)
    end = text.find(":", pos)
    if end < 0:
        raise GemmaSyntaxError("key without ':'")
    key = text[pos:end].strip()
    if not key or any(c in key for c in "{}[],<>\"'") or any(c.isspace() for c in key):
        raise GemmaSyntaxError(f"bad key {key!r}")
    return key, end


def _raw_string(text: str, pos: int) -> tuple[str, int]:
    start = pos + len(QUOTE)
    end = text.find(QUOTE, start)
    if end < 0:
        raise GemmaSyntaxError('unterminated <|"|> string')
    return text[start:end], end + len(QUOTE)


def _json_string(text: str, pos: int) -> tuple[str, int]:
    try:
        value, end = _STRING.raw_decode(text, pos)
    except ValueError as exc:
        raise GemmaSyntaxError(f"bad JSON string at {pos}") from exc
    return str(value), end


def _bare(text: str, pos: int) -> tuple[Any, int]:
    end = pos
    while end < len(text) and text[end] not in _BARE_END and not text.startswith(QUOTE, end):
        end += 1
    word = text[pos:end].strip()
    if not word or any(c in word for c in "{["):
        raise GemmaSyntaxError(f"bad value at {pos}")
    if word in ("true", "false"):
        return word == "true", end
    if word in ("null", "None"):
        return None, end
    if _NUMBER.fullmatch(word):
        number = float(word)
        return (int(word) if word.lstrip("-").isdigit() else number), end
    return word, end


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
