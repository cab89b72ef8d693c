"""mlxcore plugin `minimax`: the MiniMax-M2 tool-call and reasoning parsers.

Installed with the distribution ``mlxcore-minimax`` and loaded automatically.
It offers the tool parser ``minimax_m2`` (``<minimax:tool_call><invoke ...>``)
and the reasoning parser ``minimax_m2`` (``<think>``, opened by the prompt);
both are chosen by ``auto`` for models with the MiniMax-M2 chat template. See
docs/parsers.md.
"""

from __future__ import annotations

from mlxcore import hookimpl
from mlxcore.parsers.base import ReasoningParser, ToolParser
from mlxcore_minimax.reasoning import MiniMaxM2ReasoningParser
from mlxcore_minimax.tools import MiniMaxM2ToolParser

__all__ = ["MiniMaxM2ReasoningParser", "MiniMaxM2ToolParser"]


@hookimpl
def mlxcore_tool_parsers() -> list[type[ToolParser]]:
    """The MiniMax-M2 tool-call parser."""
    return [MiniMaxM2ToolParser]


@hookimpl
def mlxcore_reasoning_parsers() -> list[type[ReasoningParser]]:
    """The MiniMax-M2 reasoning parser."""
    return [MiniMaxM2ReasoningParser]
