"""``tool_choice`` by constrained decoding, the way vLLM does it.

The model's own tool-call markup plays no part: the output is constrained to plain
JSON and turned into calls afterwards.

* a named function (``{"type": "function", "function": {"name": N}}``): the output is
  that function's arguments, an object valid for its ``parameters`` schema
  (:func:`named_tool_schema`), and becomes one call to ``N``;
* ``"required"``: the output is a non-empty JSON array of
  ``{"name": ..., "parameters": {...}}`` items, each valid for one of the tools
  (:func:`required_tools_schema`), and every item becomes a call.

:class:`ConstrainedToolCallParser` does the turning into calls; a front end uses it
instead of the model's tool parser for such requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from mlxcore.parsers.base import ParsedDelta, ToolCall, ToolParser
from mlxcore.parsers.call_progress import CallSender, ProgressReader
from mlxcore.structured.constraints import ConstraintError, JsonSchema, validate
from mlxcore.structured.finite import infinite_path

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
"""The schema of a function declared without ``parameters``."""

ToolChoiceMode = Literal["named", "required"]


def _functions(tools: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Function name -> its definition, for OpenAI tools (``{type, function}``) or bare ones."""
    out: dict[str, Mapping[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(name, str) or not name:
            raise ConstraintError(f"tools[{i}] has no function name", f"tools[{i}]")
        if name in out:
            raise ConstraintError(
                f"tools[{i}]: the function name {name!r} is declared twice", f"tools[{i}]"
            )
        out[name] = fn
    return out


def _parameters(name: str, fn: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    params = fn.get("parameters")
    field = f"tools[{index}].function.parameters"
    if params is None:
        return EMPTY_PARAMETERS
    if not isinstance(params, Mapping):
        raise ConstraintError(
            f"the parameters of function {name!r} must be a JSON schema object", field
        )
    where = infinite_path(params)
    if where is not None:
        raise ConstraintError(
            f"the parameters of function {name!r} have no finite instance: {where} requires "
            "itself without end",
            field,
        )
    return params


def named_tool_schema(tools: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """The schema of the arguments of the function ``name`` (its ``parameters``).

    Raises :class:`ConstraintError` when ``name`` is not one of ``tools``.
    """
    functions = _functions(tools)
    if name not in functions:
        known = ", ".join(sorted(functions)) or "none"
        raise ConstraintError(f"tool_choice names function {name!r}, not in tools ({known})")
    return dict(_parameters(name, functions[name], list(functions).index(name)))


def required_tools_schema(
    tools: Sequence[Mapping[str, Any]], *, parallel: bool = True
) -> dict[str, Any]:
    """A schema for one or more calls: ``[{"name": N, "parameters": {...}}, ...]``.

    Each item is one of the tools (``anyOf``), its ``parameters`` valid for that tool's
    schema. ``parallel=False`` (OpenAI's ``parallel_tool_calls: false``) allows exactly
    one call. The tools' ``$defs`` move to the top level so their ``$ref`` keep
    resolving; two tools defining the same name differently raise
    :class:`ConstraintError`.
    """
    functions = _functions(tools)
    if not functions:
        raise ConstraintError("tool_choice 'required' needs at least one tool")
    defs: dict[str, Any] = {}
    items = []
    for index, (name, fn) in enumerate(functions.items()):
        params = dict(_parameters(name, fn, index))
        for key in ("$defs", "definitions"):
            found = params.pop(key, None)
            if found is None:
                continue
            if not isinstance(found, Mapping):
                raise ConstraintError(f"the {key} of function {name!r} must be an object")
            for def_name, definition in found.items():
                ref = f"{key}/{def_name}"
                if ref in defs and defs[ref] != definition:
                    raise ConstraintError(
                        f"tools define {key}/{def_name} differently; rename one of them"
                    )
                defs[ref] = definition
        items.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "parameters": params,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    for ref, definition in defs.items():
        key, def_name = ref.split("/", 1)
        schema.setdefault(key, {})[def_name] = definition
    return schema


def tool_choice_constraint(
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    *,
    parallel: bool = True,
) -> tuple[JsonSchema, ConstrainedToolCallParser] | None:
    """The constraint and the parser for an OpenAI ``tool_choice``, or ``None``.

    ``None`` for ``"auto"``, ``"none"`` or no choice (the model's own tool parser
    applies). The constraint is validated.

    Raises:
        ConstraintError: a choice without tools, an unknown function name, a malformed
            choice or a tool schema that cannot be enforced.
    """
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    tools = list(tools or [])
    if not tools:
        raise ConstraintError("tool_choice needs tools")
    parser: ConstrainedToolCallParser
    if tool_choice == "required":
        schema = required_tools_schema(tools, parallel=parallel)
        parser = ConstrainedToolCallParser(tools, mode="required")
    elif isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str):
            raise ConstraintError("a named tool_choice needs function.name")
        schema = named_tool_schema(tools, name)
        parser = ConstrainedToolCallParser(tools, mode="named", name=name)
    else:
        raise ConstraintError(f"tool_choice {tool_choice!r} is not none, auto or required")
    # Arguments are an object even when a tool's schema says nothing about the type.
    constraint = JsonSchema(schema if "type" in schema else {"type": "object", **schema})
    validate(constraint)
    return constraint, parser


class ConstrainedToolCallParser(ToolParser):
    """Turns the constrained JSON of a ``tool_choice`` request into tool calls.

    Holds all text back; :meth:`finish` releases the calls (and no content). Text that
    does not parse (the generation hit ``max_tokens``) is returned as content instead.

    Args:
        tools: the request's tools.
        mode: ``"named"`` (the text is one function's arguments) or ``"required"``
            (a list of ``{"name", "parameters"}`` items).
        name: the function of a ``"named"`` choice.
    """

    name = "constrained"

    def __init__(
        self,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        mode: ToolChoiceMode = "required",
        name: str | None = None,
    ) -> None:
        super().__init__(tools)
        if mode == "named" and not name:
            raise ValueError("a named tool choice needs the function name")
        self.mode = mode
        self.function = name
        self._text: list[str] = []
        self._reader = ProgressReader(
            "",
            self.tool_names() if mode == "required" else {name or ""},
            lambda _: {},  # the arguments are taken as generated: nothing to conform
            arguments_of=name if mode == "named" else None,
        )
        self._sender = CallSender()

    def feed(self, text: str) -> ParsedDelta:
        """Hold ``text`` until :meth:`finish`; stream the (first) call as it is written."""
        self._text.append(text)
        return ParsedDelta(call_parts=self._sender.update(self._reader.feed(text)))

    def finish(self) -> ParsedDelta:
        """The calls the whole output describes, or the output as content (a streamed
        call then aborted)."""
        text = "".join(self._text)
        self._text = []
        calls, aborted = self._sender.settle(self.calls(text) or [])
        if aborted is not None or not calls:
            parts = [aborted] if aborted is not None else []
            if calls:  # other arguments than streamed: the calls still count
                return ParsedDelta(tool_calls=calls, call_parts=parts)
            return ParsedDelta(content=text, call_parts=parts)
        return ParsedDelta(tool_calls=calls)

    def calls(self, text: str) -> list[ToolCall] | None:
        """The tool calls in ``text``, or ``None`` when it is not the expected JSON."""
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if self.mode == "named":
            if not isinstance(value, dict) or self.function is None:
                return None
            return [ToolCall(self.function, _arguments(value))]
        if not isinstance(value, list) or not value:
            return None
        names = self.tool_names()
        out = []
        for item in value:
            name = item.get("name") if isinstance(item, dict) else None
            if not isinstance(name, str) or name not in names:
                return None
            params = item.get("parameters", {})
            if not isinstance(params, dict):
                return None
            out.append(ToolCall(name, _arguments(params)))
        return out


def _arguments(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
