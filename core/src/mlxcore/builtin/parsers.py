"""Built-in plugin: the parsers nearly every user needs.

* tool calls: ``hermes`` (Qwen/Hermes JSON in ``<tool_call>``) and
  ``qwen3_coder`` (Qwen3-Coder / Qwen3.5 XML in ``<tool_call>``);
* reasoning: ``think`` (``<think>...</think>``).

They are registered last (``trylast``), so a plugin's parser for the same model
family is preferred by ``auto``. See docs/parsers.md.
"""

from __future__ import annotations

from mlxcore import hookimpl
from mlxcore.parsers.base import ReasoningParser, ToolParser
from mlxcore.parsers.qwen import HermesToolParser, Qwen3CoderToolParser
from mlxcore.parsers.think import ThinkReasoningParser


@hookimpl(trylast=True)
def mlxcore_tool_parsers() -> list[type[ToolParser]]:
    """The built-in tool parsers."""
    return [Qwen3CoderToolParser, HermesToolParser]


@hookimpl(trylast=True)
def mlxcore_reasoning_parsers() -> list[type[ReasoningParser]]:
    """The built-in reasoning parsers."""
    return [ThinkReasoningParser]
