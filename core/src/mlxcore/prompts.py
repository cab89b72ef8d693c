"""Turning chat messages into prompt token ids with the model's chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlxcore.errors import MlxcoreError


def render_chat_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **template_kwargs: Any,
) -> tuple[str, list[int]]:
    """Apply the tokenizer's chat template (with the generation prompt); return the
    rendered text and its token ids."""
    if not getattr(tokenizer, "chat_template", None):
        raise MlxcoreError("the model has no chat template; use raw completions instead")
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        add_generation_prompt=True,
        tokenize=False,
        **template_kwargs,
    )
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return text, ids
