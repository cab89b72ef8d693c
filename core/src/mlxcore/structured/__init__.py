"""Constrained decoding: JSON (free-form or by schema), regexes, grammars, tool choice.

Front ends describe what the output must be with a constraint object and put it in
``GenerationRequest.options["constraint"]``; the built-in plugin
:mod:`mlxcore.builtin.structured` then adds a logits processor to that request that
masks every token the constraint forbids. Enforcement is llguidance's (chosen by
measurement, see docs/decisions/0002-constrained-decoding.md).

Typical front-end use::

    constraint = from_response_format(body.response_format)   # ConstraintError -> 400
    options[OPTION] = constraint

    found = tool_choice_constraint(body.tools, body.tool_choice)  # ConstraintError -> 400
    if found is not None:
        options[OPTION], tool_parser = found   # use tool_parser for this request's output
"""

from __future__ import annotations

from mlxcore.structured.compiler import CompiledTokenizer, compiled_tokenizer, prepare
from mlxcore.structured.constraints import (
    Choice,
    Constraint,
    ConstraintError,
    JsonObject,
    JsonSchema,
    LarkGrammar,
    LazyToolGrammar,
    Regex,
    grammar_text,
    validate,
)
from mlxcore.structured.processor import (
    ConstrainedProcessor,
    ConstraintUnsatisfiable,
    ConstraintViolation,
    apply_bitmask,
    make_processor,
)
from mlxcore.structured.requested import from_response_format, structured_outputs_constraint
from mlxcore.structured.tools import (
    ConstrainedToolCallParser,
    named_tool_schema,
    required_tools_schema,
    tool_choice_constraint,
)

OPTION = "constraint"
"""The ``GenerationRequest.options`` key holding the request's :data:`Constraint`."""

START_AFTER_OPTION = "constraint_start_after"
"""Optional ``options`` key: text (e.g. ``"</think>"``) after which the constraint starts."""

MAY_OPEN_OPTION = "constraint_may_open"
"""Optional ``options`` key, with :data:`START_AFTER_OPTION`: text (e.g. ``"<think>"``)
the output may begin with instead of constrained text, opening a free block that ends
with the start-after text. Without it the constraint waits for the start-after text."""

EXIT_OPTION = "constraint_exit"
"""Optional ``options`` key, with :data:`START_AFTER_OPTION`: ``(text, where)``, a
one-token tool-call opener that starts the constrained part inside the free one where
the reasoning parser ends unclosed reasoning at it (``where``: ``"anywhere"`` or
``"line"``, at the start of a line)."""

CONSTRAINT_CODE = "invalid_constraint"
"""The error code of a constraint the request asks for and the server cannot hold: a
``tool_choice`` the ``tools`` do not meet, a ``response_format`` schema outside what the
structured-output compiler takes (no JSON Schema of the request body can state these)."""

__all__ = [
    "CONSTRAINT_CODE",
    "EXIT_OPTION",
    "MAY_OPEN_OPTION",
    "OPTION",
    "START_AFTER_OPTION",
    "Choice",
    "CompiledTokenizer",
    "ConstrainedProcessor",
    "ConstrainedToolCallParser",
    "Constraint",
    "ConstraintError",
    "ConstraintUnsatisfiable",
    "ConstraintViolation",
    "JsonObject",
    "JsonSchema",
    "LarkGrammar",
    "LazyToolGrammar",
    "Regex",
    "apply_bitmask",
    "compiled_tokenizer",
    "from_response_format",
    "grammar_text",
    "make_processor",
    "named_tool_schema",
    "prepare",
    "required_tools_schema",
    "structured_outputs_constraint",
    "tool_choice_constraint",
    "validate",
]
