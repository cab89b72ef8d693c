"""Turning chat messages into prompt token ids with the model's chat template."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from mlxcore.errors import MlxcoreError


@attrs.frozen
class RenderedPrompt:
    """A chat prompt ready for the engine.

    Attributes:
        text: the rendered template text (with the generation prompt).
        ids: its token ids.
        history_length: how many leading ids are the conversation itself, before
            the generation prompt (``<|im_start|>assistant\\n<think>\\n`` ...). The
            next turn of the conversation starts with exactly these tokens, so the
            engine keeps a reusable cache snapshot there; ``None`` when the template
            does not render the history as a prefix of the prompt.
    """

    text: str
    ids: list[int]
    history_length: int | None = None
    boundaries: tuple[int, ...] = ()
    """Token positions where each message's content starts (as far as it could be found
    in the rendered text): where another prompt sharing this one's start is likely to
    leave it (see :attr:`mlxcore.engine.request.GenerationRequest.boundaries`)."""

    def checkpoints(self) -> tuple[int, ...]:
        """Prompt positions where a reusable cache snapshot should be kept."""
        return () if self.history_length is None else (self.history_length,)


def _render(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    generation_prompt: bool,
    kwargs: Mapping[str, Any],
) -> str:
    text: str = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=generation_prompt,
        tokenize=False,
        **kwargs,
    )
    return text


Messages = list[dict[str, Any]]


def _joined(before: Any, after: Any) -> Any:
    if isinstance(before, str) and isinstance(after, str):
        return before + "\n\n" + after

    def parts(content: Any) -> list[Any]:
        return list(content) if isinstance(content, list) else [{"type": "text", "text": content}]

    return [*parts(before), {"type": "text", "text": "\n\n"}, *parts(after)]


def _later_systems_as_user(messages: Messages) -> Messages:
    return [
        {**m, "role": "user"} if m["role"] == "system" and i > 0 else m
        for i, m in enumerate(messages)
    ]


def _merge_consecutive_users(messages: Messages) -> Messages:
    out: Messages = []
    for m in messages:
        if out and m["role"] == "user" and out[-1]["role"] == "user" and "name" not in m:
            out[-1] = {**out[-1], "content": _joined(out[-1]["content"], m["content"])}
        else:
            out.append(dict(m))
    return out


def _systems_hoisted(messages: Messages) -> Messages:
    systems = [m["content"] for m in messages if m["role"] == "system"]
    rest = _merge_consecutive_users([m for m in messages if m["role"] != "system"])
    if not systems:
        return rest
    joined = systems[0]
    for more in systems[1:]:
        joined = _joined(joined, more)
    return [{"role": "system", "content": joined}, *rest]


def arrangements(messages: Sequence[Mapping[str, Any]]) -> list[Messages]:
    """The ways to show ``messages`` to a chat template, least changed first.

    As sent (system messages where they are, consecutive user messages apart), so the
    history renders the same next turn; then a later system message as a user message;
    then consecutive user messages merged (templates that demand alternating roles);
    last, every system message hoisted to the front. Only the variants that differ
    from the ones before are listed.
    """
    sent = [dict(m) for m in messages]
    out = [sent]
    for candidate in (
        _later_systems_as_user(sent),
        _merge_consecutive_users(_later_systems_as_user(sent)),
        _systems_hoisted(sent),
    ):
        if all(candidate != seen for seen in out):
            out.append(candidate)
    return out


def _shows_all(text: str, messages: Messages) -> bool:
    """Every system and user text made it into the rendered prompt (some templates
    silently drop a system message that is not first)."""
    for m in messages:
        content = m.get("content")
        shown = not isinstance(content, str) or content.strip() in text
        if m["role"] in ("system", "user") and not shown:
            return False
    return True


def _render_arranged(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> tuple[Messages, str]:
    """The first arrangement the template renders completely, and its text."""
    first: tuple[Messages, str] | None = None
    error: Exception | None = None
    for candidate in arrangements(messages):
        try:
            text = _render(tokenizer, candidate, tools, True, kwargs)
        except Exception as exc:  # the template refuses this arrangement (raise_exception)
            error = error or exc
            continue
        if _shows_all(text, candidate):
            return candidate, text
        first = first or (candidate, text)
    if first is not None:
        return first
    assert error is not None
    raise error


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> RenderedPrompt:
    """Apply the tokenizer's chat template with the generation prompt, tokenize, and
    find where the conversation history ends.

    The messages are rendered as sent when the template allows it, else in the first
    of :func:`arrangements` it renders in full."""
    if not getattr(tokenizer, "chat_template", None):
        raise MlxcoreError("the model has no chat template; use raw completions instead")
    messages, text = _render_arranged(tokenizer, messages, tools, template_kwargs)
    history = _render(tokenizer, messages, tools, False, template_kwargs)
    starts = _content_starts(text, messages)
    if not text.startswith(history) or history == text:
        ids, spans = _encode(tokenizer, text)
        return RenderedPrompt(text, ids, None, _token_positions(spans, starts, len(ids)))
    ids, boundary, spans = _encode_split(tokenizer, text, len(history))
    return RenderedPrompt(text, ids, boundary, _token_positions(spans, starts, len(ids)))


def _first_text(content: Any) -> str:
    """The first text of a message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str) and part["text"]:
                return str(part["text"])
    return ""


CONTENT_PROBE_CHARS = 64
"""How many characters of a message's content are looked for in the rendered text."""


def _content_starts(text: str, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Character offsets in ``text`` where each message's content starts, in order, for
    the messages whose first characters appear there verbatim (templates may rewrite a
    message: that one is skipped)."""
    out: list[int] = []
    at = 0
    for message in messages:
        probe = _first_text(message.get("content")).lstrip()[:CONTENT_PROBE_CHARS]
        if not probe:
            continue
        found = text.find(probe, at)
        if found < 0:
            continue
        out.append(found)
        at = found + len(probe)
    return out


def _token_positions(
    spans: list[tuple[int, int]] | None, cuts: list[int], length: int
) -> tuple[int, ...]:
    """For each character offset, how many tokens end at or before it (the tokens
    before the message), keeping those strictly inside the prompt; ``()`` without spans."""
    if spans is None:
        return ()
    ends = [end for _, end in spans]
    found = {bisect.bisect_right(ends, cut) for cut in cuts}
    return tuple(sorted(n for n in found if 0 < n < length))


def _encode(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]] | None]:
    """``text``'s token ids and, from a fast (Rust) tokenizer, each token's character
    span (``None`` from another tokenizer)."""
    fast = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        encoded = fast(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [tuple(s) for s in encoded["offset_mapping"]]
    except (NotImplementedError, TypeError, KeyError):
        return tokenizer.encode(text, add_special_tokens=False), None


def _encode_split(
    tokenizer: Any, text: str, cut: int
) -> tuple[list[int], int | None, list[tuple[int, int]] | None]:
    """``text``'s token ids, tokenized once, how many of them cover exactly
    ``text[:cut]`` (``None`` when a token straddles the cut), and the tokens' spans.

    A fast (Rust) tokenizer reports each token's character span; otherwise the
    prefix is tokenized separately and must be a prefix of the whole.
    """
    ids, spans = _encode(tokenizer, text)
    if spans is None:
        prefix: list[int] = tokenizer.encode(text[:cut], add_special_tokens=False)
        whole = 0 < len(prefix) < len(ids) and ids[: len(prefix)] == prefix
        return ids, len(prefix) if whole else None, None
    count = sum(1 for _, end in spans if end <= cut)
    straddles = any(start < cut < end for start, end in spans)
    return ids, count if 0 < count < len(ids) and not straddles else None, spans


def render_chat_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> tuple[str, list[int]]:
    """The rendered prompt text and its token ids (see :func:`render_chat`)."""
    rendered = render_chat(tokenizer, messages, tools=tools, **template_kwargs)
    return rendered.text, rendered.ids
