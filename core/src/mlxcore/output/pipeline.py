"""Per-request output processing shared by every front end.

    token ids -> streaming detokenizer (UTF-8 safe) -> stop strings
              -> reasoning parser -> tool parser -> :class:`OutputDelta`

Stop strings are matched on the raw generated text (as the OpenAI API defines
them), before any parsing, and never reach the client. The front ends (OpenAI
chat and completions, Anthropic messages) only encode the deltas this produces;
none of them parses model output itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from mlxcore.engine.strategies import StepToken
from mlxcore.output.stops import StopMatcher
from mlxcore.parsers.base import CallPart, ParsedDelta, ReasoningParser, ToolCall, ToolParser
from mlxcore.thinking import ThinkingTracker


@attrs.define
class OutputDelta:
    """What the client gets from one step: text, reasoning, calls, logprobs, finish."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = attrs.field(factory=list)
    logprobs: list[StepToken] = attrs.field(factory=list)
    finish_reason: str | None = None
    call_parts: list[CallPart] = attrs.field(factory=list)
    """Tool calls still being written (streaming front ends: :mod:`mlxcore.output.calls`)."""

    def __bool__(self) -> bool:
        return bool(
            self.content
            or self.reasoning
            or self.tool_calls
            or self.call_parts
            or self.logprobs
            or self.finish_reason
        )

    def extend(self, other: OutputDelta) -> None:
        """Append ``other`` (a later delta of the same generation) in place."""
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)
        self.call_parts.extend(other.call_parts)
        self.logprobs.extend(other.logprobs)
        self.finish_reason = other.finish_reason or self.finish_reason


class OutputPipeline:
    """Turns one request's tokens into client deltas.

    Args:
        detokenizer: a fresh streaming detokenizer
            (:func:`mlxcore.output.detokenize.continuation_detokenizer`).
        hidden_ids: token ids never shown as text (EOS and other stop tokens).
        stops: stop strings.
        reasoning: the request's reasoning parser instance, if any.
        tools: the request's tool parser instance, if any.
        thinking: follows the think block by token id, for :attr:`reasoning_tokens`.
    """

    def __init__(
        self,
        detokenizer: Any,
        *,
        hidden_ids: frozenset[int] = frozenset(),
        stops: Sequence[str] = (),
        reasoning: ReasoningParser | None = None,
        tools: ToolParser | None = None,
        thinking: ThinkingTracker | None = None,
    ) -> None:
        self.detokenizer = detokenizer
        self.hidden_ids = hidden_ids
        self.stops = StopMatcher(stops)
        self.reasoning = reasoning
        self.tools = tools
        self.thinking = thinking
        self.saw_tool_call = False
        self.finished = False

    @property
    def stop_matched(self) -> bool:
        """True once a stop string appeared: the caller should end the generation."""
        return self.stops.matched is not None

    @property
    def reasoning_tokens(self) -> int:
        """Tokens generated inside the think block so far (its tags not counted)."""
        return 0 if self.thinking is None else self.thinking.count

    def push(self, tokens: Sequence[StepToken]) -> OutputDelta:
        """Process newly generated tokens."""
        delta = OutputDelta(logprobs=[t for t in tokens if t.logprob is not None])
        if self.thinking is not None:
            for tok in tokens:
                self.thinking.feed(tok.token)
        if self.stop_matched:
            return delta
        for tok in tokens:
            if tok.token not in self.hidden_ids:
                self.detokenizer.add_token(tok.token)
        text = self.stops.feed(self.detokenizer.last_segment)
        self._parse(text, delta, final=self.stop_matched)
        return delta

    def finish(self, engine_reason: str) -> OutputDelta:
        """Flush everything held back and set the finish reason.

        ``engine_reason`` is the engine's (``stop``, ``length``, ``cancelled``,
        ``error``); a request that produced tool calls and stopped naturally
        finishes with ``tool_calls``.
        """
        delta = OutputDelta()
        if not self.finished:
            if not self.stop_matched:
                self.detokenizer.finalize()
                text = self.stops.feed(self.detokenizer.last_segment)
                text += self.stops.flush()
                self._parse(text, delta, final=True)
            self.finished = True
        reason = "stop" if self.stop_matched else engine_reason
        if reason == "stop" and self.saw_tool_call:
            reason = "tool_calls"
        delta.finish_reason = reason
        return delta

    def _parse(self, text: str, delta: OutputDelta, *, final: bool) -> None:
        parsed = ParsedDelta(content=text)
        if self.reasoning is not None:
            parsed = self.reasoning.feed(text)
            if final:
                parsed.extend(self.reasoning.finish())
        if self.tools is not None:
            answer = self.tools.feed(parsed.content)
            if final:
                answer.extend(self.tools.finish())
            parsed = ParsedDelta(reasoning=parsed.reasoning)
            parsed.extend(answer)
        delta.content += parsed.content
        delta.reasoning += parsed.reasoning
        delta.tool_calls.extend(parsed.tool_calls)
        delta.call_parts.extend(parsed.call_parts)
        self.saw_tool_call = self.saw_tool_call or bool(parsed.tool_calls)
