"""Decoding MiniMax-M2's ``<invoke>`` call format.

Inside ``<minimax:tool_call>...</minimax:tool_call>`` (official template
MiniMax-M2.jinja), one or more::

    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    <parameter name="days">3</parameter>
    </invoke>

Values are text (objects and arrays as JSON), typed later with the request's
schema. Attribute values may be double-quoted, single-quoted or bare. One
newline on each side of a value is not part of it. Inside a closed block a
missing ``</parameter>`` ends at the next ``<parameter`` and a missing
``</invoke>`` at the end of the block; when the output ended inside the block
(``strict``) every closing tag must be there.
"""

from __future__ import annotations

import re

from mlxcore.parsers.call_progress import Markup

INVOKE = "<invoke"
INVOKE_END = "</invoke>"
PARAMETER = "<parameter"
PARAMETER_END = "</parameter>"
_ATTR = re.compile(r"""\s+name\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))\s*>""")

MARKUP = Markup(
    re.compile(re.escape(INVOKE) + _ATTR.pattern),
    re.compile(re.escape(PARAMETER) + _ATTR.pattern),
    PARAMETER,
    PARAMETER_END,
    (PARAMETER, PARAMETER_END, INVOKE_END),
)
"""The format for streaming a call while it is written (:mod:`mlxcore.parsers.call_progress`)."""


def decode_invokes(text: str, *, strict: bool = False) -> list[tuple[str, dict[str, str]]] | None:
    """Every ``<invoke name=...>...</invoke>`` in ``text``: (name, raw parameter texts).

    ``None`` when there is none, text other than whitespace sits between them,
    a tag is malformed, or (``strict``) a closing tag is missing.
    """
    calls: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while True:
        start = text.find(INVOKE, pos)
        if start < 0:
            if text[pos:].strip():
                return None
            return calls or None
        if text[pos:start].strip():
            return None
        name, body_start = _named_tag(text, start + len(INVOKE))
        if not name:
            return None
        end = text.find(INVOKE_END, body_start)
        if end < 0 and strict:
            return None
        body_end = end if end >= 0 else len(text)
        params = _parameters(text[body_start:body_end], strict)
        if params is None:
            return None
        calls.append((name, params))
        pos = body_end + len(INVOKE_END) if end >= 0 else len(text)


def _named_tag(text: str, pos: int) -> tuple[str, int]:
    """The ``name`` attribute of the tag whose attributes start at ``pos``, and the
    offset after its ``>``; ``("", pos)`` when malformed."""
    match = _ATTR.match(text, pos)
    if match is None:
        return "", pos
    name = next(g for g in match.groups() if g is not None).strip()
    return name, match.end()


def _parameters(body: str, strict: bool) -> dict[str, str] | None:
    params: dict[str, str] = {}
    pos = 0
    while True:
        start = body.find(PARAMETER, pos)
        if start < 0:
            return None if body[pos:].strip() else params
        if body[pos:start].strip():
            return None
        key, value_start = _named_tag(body, start + len(PARAMETER))
        if not key:
            return None
        end = body.find(PARAMETER_END, value_start)
        following = body.find(PARAMETER, value_start)
        if end < 0 or 0 <= following < end:
            if strict:
                return None
            stop = following if following >= 0 else len(body)
            params[key] = _trim_newline(body[value_start:stop])
            if following < 0:
                return params
            pos = stop
            continue
        params[key] = _trim_newline(body[value_start:end])
        pos = end + len(PARAMETER_END)


def _trim_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
