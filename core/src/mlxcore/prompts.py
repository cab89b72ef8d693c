"""Turning chat messages into prompt token ids with the model's chat template."""

from __future__ import annotations

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


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> RenderedPrompt:
    """Apply the tokenizer's chat template with the generation prompt, tokenize, and
    find where the conversation history ends."""
    if not getattr(tokenizer, "chat_template", None):
        raise MlxcoreError("the model has no chat template; use raw completions instead")
    text = _render(tokenizer, messages, tools, True, template_kwargs)
    history = _render(tokenizer, messages, tools, False, template_kwargs)
    if not text.startswith(history) or history == text:
        return RenderedPrompt(text, tokenizer.encode(text, add_special_tokens=False))
    ids, boundary = _encode_split(tokenizer, text, len(history))
    return RenderedPrompt(text, ids, boundary)


def _encode_split(tokenizer: Any, text: str, cut: int) -> tuple[list[int], int | None]:
    """``text``'s token ids, tokenized once, and how many of them cover exactly
    ``text[:cut]`` (``None`` when a token straddles the cut).

    A fast (Rust) tokenizer reports each token's character span; otherwise the
    prefix is tokenized separately and must be a prefix of the whole.
    """
    fast = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        encoded = fast(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, spans = list(encoded["input_ids"]), list(encoded["offset_mapping"])
    except (NotImplementedError, TypeError, KeyError):
        ids = tokenizer.encode(text, add_special_tokens=False)
        prefix: list[int] = tokenizer.encode(text[:cut], add_special_tokens=False)
        whole = 0 < len(prefix) < len(ids) and ids[: len(prefix)] == prefix
        return ids, len(prefix) if whole else None
    count = sum(1 for _, end in spans if end <= cut)
    straddles = any(start < cut < end for start, end in spans)
    return ids, count if 0 < count < len(ids) and not straddles else None


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
