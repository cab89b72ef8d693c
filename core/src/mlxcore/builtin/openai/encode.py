"""OpenAI response shapes: chat completions, text completions, chunks, usage, logprobs."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec

from mlxcore.engine.events import Usage
from mlxcore.engine.strategies import StepToken
from mlxcore.output.calls import CallEvent
from mlxcore.parsers.base import ToolCall
from mlxcore.server.sse import EventStream, event_stream


def new_id(prefix: str) -> str:
    """A response id such as ``chatcmpl-<hex>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    """Unix time in seconds."""
    return int(time.time())


def usage_body(usages: Sequence[Usage]) -> dict[str, Any]:
    """OpenAI ``usage`` summed over choices (prompt counted once), with cache and
    reasoning details and plugin extension fields."""
    first = usages[0]
    completion = sum(u.completion_tokens for u in usages)
    reasoning = sum(u.reasoning_tokens for u in usages)
    body: dict[str, Any] = {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    for usage in usages:
        body.update(usage.extra)
    return body


def running_usage(gens: Sequence[Any]) -> dict[str, Any]:
    """``usage`` so far, for vLLM's ``stream_options.continuous_usage_stats`` (the
    generations' prompt and the tokens generated up to now)."""
    prompt = len(gens[0].request.prompt_tokens)
    completion = sum(g.generated for g in gens)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def tool_call_body(call: ToolCall, index: int) -> dict[str, Any]:
    """One tool call as OpenAI encodes it (complete, in a single delta)."""
    return {
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def tool_call_part(event: CallEvent) -> dict[str, Any] | None:
    """A streamed tool call's delta for one :class:`CallEvent`: id, type and name (empty
    arguments) when it opens, then each argument fragment; nothing when it closes."""
    if event.kind == "open":
        return {
            "index": event.index,
            "id": event.id,
            "type": "function",
            "function": {"name": event.name, "arguments": ""},
        }
    if event.kind == "arguments":
        return {"index": event.index, "function": {"arguments": event.text}}
    return None


class LogprobEncoder:
    """Turns :class:`StepToken` logprobs into OpenAI's shapes."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def text(self, token: int) -> str:
        """The text of one token."""
        text: str = self.tokenizer.decode([token])
        return text

    def chat(self, tokens: Sequence[StepToken]) -> dict[str, Any]:
        """``{"content": [...]}`` for chat completions."""
        items = []
        for tok in tokens:
            text = self.text(tok.token)
            items.append(
                {
                    "token": text,
                    "logprob": tok.logprob,
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {"token": (t := self.text(tid)), "logprob": lp, "bytes": list(t.encode())}
                        for tid, lp in tok.top_logprobs
                    ],
                }
            )
        return {"content": items}

    def completion(self, tokens: Sequence[StepToken]) -> dict[str, Any]:
        """Legacy completions logprobs (``tokens``, ``token_logprobs``, ``top_logprobs``)."""
        texts = [self.text(t.token) for t in tokens]
        return {
            "tokens": texts,
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{self.text(tid): lp for tid, lp in t.top_logprobs} for t in tokens],
            "text_offset": [],
        }

    def echoed_prompt(
        self, prompt: Sequence[int], scored: Sequence[StepToken] | None
    ) -> dict[str, Any]:
        """Legacy completions logprobs of an echoed prompt: its first token has none
        (nothing precedes it); ``scored`` holds the others'."""
        rest = list(scored or [])
        return {
            "tokens": [self.text(t) for t in prompt],
            "token_logprobs": [None, *(t.logprob for t in rest)],
            "top_logprobs": [None, *({self.text(i): lp for i, lp in t.top_logprobs} for t in rest)],
            "text_offset": [],
        }

    def vllm_prompt(self, scored: Sequence[StepToken]) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs``: ``None`` for the first prompt token, then for each
        token ``{id: {"logprob", "rank", "decoded_token"}}`` with its alternatives."""
        out: list[dict[str, Any] | None] = [None]
        for tok in scored:
            entry = {
                str(i): {"logprob": lp, "rank": rank, "decoded_token": self.text(i)}
                for rank, (i, lp) in enumerate(tok.top_logprobs, start=1)
            }
            entry[str(tok.token)] = {
                "logprob": tok.logprob,
                "rank": tok.rank,
                "decoded_token": self.text(tok.token),
            }
            out.append(entry)
        return out


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def openai_stream(chunks: AsyncIterator[bytes]) -> EventStream:
    """An OpenAI SSE response: an error after the response started becomes a final
    ``{"error": ...}`` event and ``[DONE]`` instead of a broken connection."""
    return event_stream(chunks, lambda err: sse(err.body()) + SSE_DONE)
