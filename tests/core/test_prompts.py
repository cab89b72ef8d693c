"""Chat prompts are tokenized once, and the history boundary is where the next turn's
prompt starts: the same count a separate encoding of the history gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mlxcore.models.loader import load_model
from mlxcore.prompts import _encode_split, arrangements, render_chat

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there!"},
        {"role": "user", "content": "more  \n\n spaces ünïcödé 😀"},
    ],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
]


def two_encodes(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], int | None]:
    """The reference: encode the prompt and the history separately."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    history = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not text.startswith(history) or history == text:
        return ids, None
    prefix = tokenizer.encode(history, add_special_tokens=False)
    whole = 0 < len(prefix) < len(ids) and ids[: len(prefix)] == prefix
    return ids, len(prefix) if whole else None


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen3", "tiny_qwen3_5", "tiny_gemma4"])
def test_one_tokenization_gives_the_two_encode_boundary(
    family: str, request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(family)
    tokenizer = load_model(str(path), lazy=True).tokenizer
    for messages in CONVERSATIONS:
        rendered = render_chat(tokenizer, messages)
        ids, boundary = two_encodes(tokenizer, messages)
        assert rendered.ids == ids
        assert rendered.history_length == boundary
        assert boundary is not None


class EncodeOnly:
    """A tokenizer without character offsets (a slow, Python tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        self.encode = tokenizer.encode


def test_a_tokenizer_without_offsets_falls_back_to_two_encodes(tiny_qwen3: Path) -> None:
    tokenizer = load_model(str(tiny_qwen3), lazy=True).tokenizer
    text = tokenizer.apply_chat_template(
        CONVERSATIONS[1], add_generation_prompt=True, tokenize=False
    )
    history = tokenizer.apply_chat_template(CONVERSATIONS[1], tokenize=False)
    fast = _encode_split(tokenizer, text, len(history))
    slow = _encode_split(EncodeOnly(tokenizer), text, len(history))
    assert fast[:2] == slow[:2] and fast[1] is not None
    # a cut inside a token has no boundary
    inside = text.index("spaces") + 2
    assert _encode_split(tokenizer, text, inside)[1] is None


MID_SYSTEM = [
    {"role": "system", "content": "SYSTEM-ONE"},
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "system", "content": "SYSTEM-TWO"},
    {"role": "user", "content": "second"},
    {"role": "user", "content": "third"},
]


def test_arrangements_go_from_as_sent_to_hoisted() -> None:
    ways = arrangements(MID_SYSTEM)
    assert ways[0] == MID_SYSTEM
    assert [m["role"] for m in ways[1]] == ["system", "user", "assistant", "user", "user", "user"]
    assert [m["role"] for m in ways[2]] == ["system", "user", "assistant", "user"]
    assert ways[2][-1]["content"] == "SYSTEM-TWO\n\nsecond\n\nthird"
    assert ways[-1][0] == {"role": "system", "content": "SYSTEM-ONE\n\nSYSTEM-TWO"}
    assert arrangements([{"role": "user", "content": "x"}]) == [[{"role": "user", "content": "x"}]]


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen3", "tiny_qwen3_5", "tiny_gemma4"])
def test_mid_conversation_system_messages_keep_the_history_a_prefix(
    family: str, request: pytest.FixtureRequest
) -> None:
    """Whatever the template allows, every text is shown and the turns before the new
    system message render exactly as they did on the previous turn."""
    path: Path = request.getfixturevalue(family)
    tokenizer = load_model(str(path), lazy=True).tokenizer
    previous = render_chat(tokenizer, MID_SYSTEM[:2])
    now = render_chat(tokenizer, MID_SYSTEM)
    for text in ("SYSTEM-ONE", "SYSTEM-TWO", "first question", "second", "third"):
        assert text in now.text
    assert previous.history_length is not None
    assert now.ids[: previous.history_length] == previous.ids[: previous.history_length]
