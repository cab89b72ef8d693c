"""Tool-call and reasoning parsers: base classes and the built-in formats."""

from mlxcore.parsers.base import ParsedDelta, ReasoningParser, ToolCall, ToolParser

__all__ = ["ParsedDelta", "ReasoningParser", "ToolCall", "ToolParser"]
