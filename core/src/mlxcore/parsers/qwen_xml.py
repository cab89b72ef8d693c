"""Decoding the Qwen3-Coder / Qwen3.5 XML call format.

Inside ``<tool_call>...</tool_call>`` (official templates Qwen3-Coder.jinja and
Qwen3.5-4B.jinja)::

    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>

Every value is text (the template writes objects and arrays as JSON, and
everything else with Jinja's ``string`` filter); the newline the template puts
on each side of a value is removed and the rest is kept exactly, then typed
with the request's schema (:mod:`mlxcore.parsers.schema_types`).

Lenient where models are sloppy, inside a closed ``<tool_call>`` block: a
missing ``</parameter>`` ends at the next ``<parameter=`` or at ``</function>``;
a missing ``</function>`` ends at the end of the block. When the output ended
inside the block (``strict``), every closing tag must be there: a call cut
short by ``max_tokens`` is never passed off as complete. A parameter name
repeated keeps the last value.
"""

from __future__ import annotations

FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"


def decode_xml_functions(
    text: str, *, strict: bool = False
) -> list[tuple[str, dict[str, str]]] | None:
    """Every ``<function=NAME>...</function>`` in ``text``: (name, raw parameter texts).

    ``None`` when there is none, a name is empty or holds whitespace, text other
    than whitespace sits between functions, or (``strict``) a closing tag is missing.
    """
    calls: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while True:
        start = text.find(FUNCTION, pos)
        if start < 0:
            if text[pos:].strip():
                return None
            break
        if text[pos:start].strip():
            return None
        name_end = text.find(">", start)
        if name_end < 0:
            return None
        name = text[start + len(FUNCTION) : name_end].strip()
        if not name or any(c.isspace() for c in name):
            return None
        end = text.find(FUNCTION_END, name_end)
        if end < 0 and strict:
            return None
        body_end = end if end >= 0 else len(text)
        params = decode_parameters(text[name_end + 1 : body_end], strict=strict)
        if params is None:
            return None
        calls.append((name, params))
        pos = body_end + len(FUNCTION_END) if end >= 0 else len(text)
    return calls or None


def decode_parameters(body: str, *, strict: bool = False) -> dict[str, str] | None:
    """The ``<parameter=KEY>VALUE</parameter>`` pairs of one function body.

    ``None`` when text other than whitespace sits outside the parameters, or
    (``strict``) a ``</parameter>`` is missing.
    """
    params: dict[str, str] = {}
    pos = 0
    while True:
        start = body.find(PARAMETER, pos)
        if start < 0:
            return params if not body[pos:].strip() else None
        if body[pos:start].strip():
            return None
        key_end = body.find(">", start)
        if key_end < 0:
            return None
        key = body[start + len(PARAMETER) : key_end].strip()
        if not key:
            return None
        end = body.find(PARAMETER_END, key_end)
        following = body.find(PARAMETER, key_end)
        if end < 0 or 0 <= following < end:  # no closing tag: ends at the next one
            if strict:
                return None
            stop = following if following >= 0 else len(body)
            params[key] = trim_newlines(body[key_end + 1 : stop])
            pos = stop
            if following < 0:
                return params
            continue
        params[key] = trim_newlines(body[key_end + 1 : end])
        pos = end + len(PARAMETER_END)


def trim_newlines(value: str) -> str:
    """A value without the one newline the template writes on each side of it."""
    if value.startswith("\r\n"):
        value = value[2:]
    elif value.startswith("\n"):
        value = value[1:]
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    return value
