"""Typing tool-call arguments from the request's JSON schema (mlxcore.parsers.schema_types).

Where mlx-lm's own (non-streaming) parsers are right, ours must agree with
them: they serve as an independent oracle for the common values.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mlx_lm.tool_parsers import minimax_m2 as mlx_minimax
from mlx_lm.tool_parsers import qwen3_coder as mlx_qwen3_coder

from mlxcore.parsers.qwen import Qwen3CoderToolParser
from mlxcore.parsers.schema_types import (
    coerce_arguments,
    coerce_text,
    conform_arguments,
    parameters_of,
    schema_types,
)

INT = {"type": "integer"}
NUM = {"type": "number"}
BOOL = {"type": "boolean"}
STR = {"type": "string"}
OBJ = {"type": "object"}
ARR = {"type": "array"}
NULLABLE_STR = {"anyOf": [STR, {"type": "null"}]}


@pytest.mark.parametrize(
    ("text", "schema", "expected"),
    [
        ("42", INT, 42),
        (" -7 ", INT, -7),
        ("3.0", INT, 3),
        ("1e2", INT, 100),
        ("4.5", INT, "4.5"),
        ("twelve", INT, "twelve"),
        ("1.5", NUM, 1.5),
        ("10", NUM, 10),
        ("-2.5e-3", NUM, -0.0025),
        ("nan", NUM, "nan"),
        ("inf", NUM, "inf"),
        ("1_000", NUM, "1_000"),
        ("true", BOOL, True),
        ("False", BOOL, False),
        ("yes", BOOL, True),
        ("0", BOOL, False),
        ("perhaps", BOOL, "perhaps"),
        ("null", NULLABLE_STR, None),
        ("None", {"type": ["integer", "null"]}, None),
        ("null", STR, "null"),  # a string-only parameter keeps the word
        ("null", INT, None),
        (" spaced \n", STR, " spaced \n"),  # strings are kept exactly
        ("007", STR, "007"),
        ('{"a": [1, {"b": null}]}', OBJ, {"a": [1, {"b": None}]}),
        ("{'a': True}", OBJ, {"a": True}),  # Python literal
        ("[1, 2]", ARR, [1, 2]),
        ("(1, 2)", ARR, "(1, 2)"),
        ("[1, 2]", OBJ, "[1, 2]"),
        ("{broken", OBJ, "{broken"),
        ("5", {"anyOf": [INT, STR]}, 5),
        ("five", {"anyOf": [INT, STR]}, "five"),
        ("1", {"anyOf": [BOOL, INT]}, 1),
        ("true", {"oneOf": [INT, BOOL]}, True),
        ("b", {"enum": ["a", "b"]}, "b"),
        ("2", {"enum": [1, 2]}, 2),
        ('{"x": 1}', {}, {"x": 1}),  # no type information: JSON containers only
        ("12", {}, "12"),
        ("12", None, "12"),  # undeclared parameter
        ('{"k": 1}', {"properties": {"k": INT}}, {"k": 1}),
        ("[3]", {"items": INT}, [3]),
        ("3", {"type": "int"}, 3),  # common aliases
        ("2.5", {"type": "float"}, 2.5),
    ],
)
def test_coerce_text(text: str, schema: Any, expected: Any) -> None:
    value = coerce_text(text, schema)
    assert value == expected and type(value) is type(expected)


def test_schema_types_are_ordered_and_deduplicated() -> None:
    schema = {"anyOf": [STR, {"type": ["null", "integer"]}, {"allOf": [NUM]}], "const": 1}
    assert schema_types(schema) == ["null", "integer", "number", "string"]


def test_conform_converts_only_strings_the_schema_forbids() -> None:
    props = {
        "n": INT,
        "s": STR,
        "flag": BOOL,
        "nested": {"type": "object", "properties": {"k": NUM}},
        "list": {"type": "array", "items": INT},
    }
    args = {
        "n": "3",
        "s": "3",
        "flag": "true",
        "nested": {"k": "2.5", "other": "x"},
        "list": ["1", 2, "x"],
        "extra": "7",
    }
    assert conform_arguments(args, props) == {
        "n": 3,
        "s": "3",
        "flag": True,
        "nested": {"k": 2.5, "other": "x"},
        "list": [1, 2, "x"],
        "extra": "7",
    }


def test_parameters_of_finds_the_tool() -> None:
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": {"properties": {"x": INT}}}},
        {"name": "b", "parameters": {"type": "object"}},  # bare function definition
    ]
    assert parameters_of(tools, "a") == {"x": INT}
    assert parameters_of(tools, "b") == {}
    assert parameters_of(tools, "missing") == {}


ORACLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "i": INT,
                    "n": NUM,
                    "b": BOOL,
                    "s": STR,
                    "o": OBJ,
                    "a": ARR,
                    "u": {"anyOf": [INT, {"type": "null"}]},
                },
            },
        },
    }
]
ORACLE_VALUES = {
    "i": "12",
    "n": "0.25",
    "b": "false",
    "s": "two words",
    "o": '{"k": [1, 2]}',
    "a": '["x", 3]',
    "u": "null",
}


def test_xml_typing_agrees_with_mlx_lm_qwen3_coder() -> None:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in ORACLE_VALUES.items())
    function = f"<function=f>\n{body}</function>"
    theirs = mlx_qwen3_coder.parse_tool_call(function, ORACLE_TOOLS)  # the block's inside
    text = f"<tool_call>\n{function}\n</tool_call>"
    (call,) = Qwen3CoderToolParser(ORACLE_TOOLS).parse(text).tool_calls
    assert json.loads(call.arguments) == theirs["arguments"]


def test_invoke_typing_agrees_with_mlx_lm_minimax() -> None:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in ORACLE_VALUES.items())
    theirs = mlx_minimax.parse_tool_call(f'<invoke name="f">\n{body}</invoke>', ORACLE_TOOLS)
    props = parameters_of(ORACLE_TOOLS, "f")
    assert coerce_arguments(ORACLE_VALUES, props) == theirs["arguments"]
