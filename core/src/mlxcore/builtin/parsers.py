"""Built-in plugin: the parsers nearly every user needs.

The Qwen/Hermes JSON and Qwen3-Coder XML tool formats and ``<think>`` reasoning
come with the parser work (see docs/parsers.md); until then this plugin offers
no parser and every model's output is passed through as content.
"""

from __future__ import annotations

from mlxcore import hookimpl
from mlxcore.parsers.base import ReasoningParser, ToolParser


@hookimpl(trylast=True)
def mlxcore_tool_parsers() -> list[type[ToolParser]]:
    """The built-in tool parsers."""
    return []


@hookimpl(trylast=True)
def mlxcore_reasoning_parsers() -> list[type[ReasoningParser]]:
    """The built-in reasoning parsers."""
    return []
