"""mlxcore plugin `gemma4`: the Gemma 4 tool-call and reasoning parsers.

Installed with the distribution ``mlxcore-gemma4`` and loaded automatically.
It offers the tool parser ``gemma4`` (``<|tool_call>call:NAME{...}<tool_call|>``)
and the reasoning parser ``gemma4`` (``<|channel>thought ... <channel|>``); both
are chosen by ``--tool-call-parser auto`` / ``--reasoning-parser auto`` for
models with the Gemma 4 chat template or special tokens. See docs/parsers.md.
"""

from __future__ import annotations

from mlxcore import hookimpl
from mlxcore.parsers.base import ReasoningParser, ToolParser
from mlxcore_gemma4.reasoning import Gemma4ReasoningParser
from mlxcore_gemma4.tools import Gemma4ToolParser

__all__ = ["Gemma4ReasoningParser", "Gemma4ToolParser"]


@hookimpl
def mlxcore_tool_parsers() -> list[type[ToolParser]]:
    """The Gemma 4 tool-call parser."""
    return [Gemma4ToolParser]


@hookimpl
def mlxcore_reasoning_parsers() -> list[type[ReasoningParser]]:
    """The Gemma 4 thought-channel parser."""
    return [Gemma4ReasoningParser]
