"""Which constraint a request's tool calls get: the model's own call format, or none.

Called by the request builder for every chat request with tools (decision 0023). With
``--tool-call-grammar on`` (the default) and a tool parser that declares its call
grammar (:meth:`~mlxcore.parsers.base.ToolParser.call_grammar`):

* ``tool_choice: auto`` (no other constraint): a lazy grammar, free text until the
  call opener, a valid call after it;
* ``required`` / a named function: the native grammar from the first token, read back
  by the model's own parser (instead of the plain JSON of
  :mod:`mlxcore.structured.tools`).

Tools whose schemas the grammar cannot express leave the request as it was (auto
unconstrained, forced choices as plain JSON); the reason is logged once per reason.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import attrs

from mlxcore import structured
from mlxcore.parsers.base import ReasoningParser, ToolParser
from mlxcore.structured.call_grammar import (
    GrammarUnsupported,
    ToolChoiceMode,
    special_token_finder,
    tool_call_grammar,
)

log = logging.getLogger(__name__)

_reported: set[str] = set()
_reported_lock = threading.Lock()
_MAX_REPORTED = 256


@attrs.frozen
class ToolGrammar:
    """The constraint a request's tool calls get in the model's own format."""

    value: Any
    """A :class:`~mlxcore.structured.LazyToolGrammar` (``auto``) or a
    :class:`~mlxcore.structured.LarkGrammar` (forced choices)."""
    lazy: bool
    field: str
    exit_marker: tuple[str, str] | None = None
    """For forced choices: the opener, if the reasoning parser ends unclosed reasoning
    at it, and where (``"anywhere"`` / ``"line"``)."""


def tool_call_constraint(
    parser: type[ToolParser] | None,
    tokenizer: Any,
    tools: list[dict[str, Any]] | None,
    current: Any,
    *,
    enabled: bool = True,
    parallel: bool = True,
    reasoning: type[ReasoningParser] | None = None,
) -> ToolGrammar | None:
    """The constraint for a request's tool calls in the model's own format, or ``None``
    (the request keeps ``current``).

    Args:
        parser: the model's tool parser class (``None``: no tool calls to constrain).
        tokenizer: the model's tokenizer.
        tools: the request's tools (``None`` or empty: nothing to do).
        current: the request's constraint so far (``None``, a forced tool choice with
            ``tool_mode`` set, or another output constraint, which is kept).
        enabled: ``--tool-call-grammar on``.
        parallel: the request allows several calls (``auto``; forced choices carry
            their own).
        reasoning: the model's reasoning parser class: an opener it takes as the end of
            unclosed reasoning starts a call there too.

    A schema the format cannot express, or a parser whose grammar fails, leaves the
    request as it was (logged once per reason): never an error the client did not ask for.
    """
    if not enabled or parser is None or not tools:
        return None
    mode: ToolChoiceMode | None = "auto" if current is None else current.tool_mode
    if mode is None:
        return None  # response_format and the like: not a tool call
    if current is not None:
        parallel = current.parallel
    name = getattr(current, "tool_name", None)
    try:
        compiled = structured.compiled_tokenizer(tokenizer)
        found = tool_call_grammar(
            parser.call_grammar,
            tools,
            special_token_finder(tokenizer, compiled.ll.is_special_token),
            mode=mode,
            name=name,
            parallel=parallel,
        )
        if found is not None:  # compiled (and kept) now: never a 400 the client did not ask for
            value = found if isinstance(found, structured.LazyToolGrammar) else found.grammar
            structured.prepare(tokenizer, value)
    except (GrammarUnsupported, structured.ConstraintError) as exc:
        _report(f"tool calls of this request unconstrained ({parser.name} format): {exc}")
        return None
    except Exception as exc:  # a parser's grammar code failed: its bug, not the request's
        _report(f"tool calls unconstrained: the {parser.name} parser's call grammar failed: "
                f"{type(exc).__name__}: {exc}", logging.WARNING)  # fmt: skip
        return None
    if found is None:
        return None
    where = _reasoning_exit(reasoning, found.opener)
    if isinstance(found, structured.LazyToolGrammar):
        return ToolGrammar(attrs.evolve(found, in_reasoning=where), lazy=True, field="tools")
    exit_marker = (found.opener, where) if where else None
    return ToolGrammar(found.grammar, lazy=False, field="tool_choice", exit_marker=exit_marker)


def _reasoning_exit(reasoning: type[ReasoningParser] | None, opener: str) -> str | None:
    """``"anywhere"`` / ``"line"`` when the reasoning parser takes ``opener`` as the end of
    unclosed reasoning (anywhere, or at the start of a line), else ``None``."""
    if reasoning is None or opener not in getattr(reasoning, "exit_markers", ()):
        return None
    return "anywhere" if getattr(reasoning, "exit_anywhere", False) else "line"


def _report(message: str, level: int = logging.INFO) -> None:
    """Log ``message`` at ``level`` the first time, at DEBUG after (a client cannot fill
    the log)."""
    with _reported_lock:
        first = message not in _reported and len(_reported) < _MAX_REPORTED
        if first:
            _reported.add(message)
    log.log(level if first else logging.DEBUG, "%s", message)
