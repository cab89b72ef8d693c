"""Choosing the tool and reasoning parser for a model, once, at load time."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from mlxcore.errors import UsageError
from mlxcore.model_info import ModelInfo
from mlxcore.parsers.base import ReasoningParser, ToolParser
from mlxcore.registry import Registry

log = logging.getLogger(__name__)

P = TypeVar("P")
DISABLED = ("none", "off")


def _select(registry: Registry[type[P]], wanted: str, info: ModelInfo, flag: str) -> type[P] | None:
    if wanted in DISABLED:
        return None
    if wanted != "auto":
        if wanted not in registry:
            known = ", ".join(registry.names()) or "none"
            raise UsageError(f"{flag} {wanted!r}: no such parser (known: {known}, auto, none)")
        return registry.get(wanted)
    for entry in registry:
        if entry.item.matches(info):  # type: ignore[attr-defined]
            return entry.item
    return None


class ParserSource(Protocol):
    """Where parser classes come from (:class:`mlxcore.hooks.PluginHooks` in the server)."""

    def tool_parsers(self) -> Registry[type[ToolParser]]:
        """Every tool parser class, by name."""
        ...

    def reasoning_parsers(self) -> Registry[type[ReasoningParser]]:
        """Every reasoning parser class, by name."""
        ...


@attrs.frozen
class Parsers:
    """The parser classes chosen for the served model (``None``: pass text through)."""

    tool: type[ToolParser] | None
    reasoning: type[ReasoningParser] | None

    @classmethod
    def select(cls, hooks: ParserSource, info: ModelInfo, tool: str, reasoning: str) -> Parsers:
        """Pick by name, or by ``matches(info)`` for ``auto``; refuse unknown names."""
        chosen = cls(
            tool=_select(hooks.tool_parsers(), tool, info, "--tool-call-parser"),
            reasoning=_select(hooks.reasoning_parsers(), reasoning, info, "--reasoning-parser"),
        )
        log.info(
            "parsers: tool=%s reasoning=%s",
            chosen.tool.name if chosen.tool else "none",
            chosen.reasoning.name if chosen.reasoning else "none",
        )
        return chosen

    def tool_parser(self, tools: Sequence[Mapping[str, Any]] | None) -> ToolParser | None:
        """A fresh tool parser for one request (``None`` without tools or parser)."""
        if self.tool is None or not tools:
            return None
        return self.tool(tools)

    def reasoning_parser(self, prompt_text: str) -> ReasoningParser | None:
        """A fresh reasoning parser for one request, told whether the prompt opened
        a reasoning block. Created even when the request turned thinking off, so a
        model that thinks anyway has its reasoning separated, not leaked."""
        if self.reasoning is None:
            return None
        opened = self.reasoning.prompt_opens_reasoning(prompt_text)
        return self.reasoning(starts_in_reasoning=opened)

    def control_ids(self, vocab: Mapping[str, int]) -> frozenset[int]:
        """Token ids of the chosen parsers' pure-markup control tokens, never shown."""
        names = [
            *(self.tool.control_tokens if self.tool else ()),
            *(self.reasoning.control_tokens if self.reasoning else ()),
        ]
        return frozenset(vocab[n] for n in names if n in vocab)
