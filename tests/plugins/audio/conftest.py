"""Shared by the audio plugin's server tests."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import openai
import pytest


@pytest.fixture
def beside_chats() -> Callable[[openai.OpenAI, Callable[[int], Any], int], list[Any]]:
    """:func:`run_beside_chats`."""
    return run_beside_chats


def run_beside_chats(client: openai.OpenAI, work: Callable[[int], Any], count: int) -> list[Any]:
    """``count`` calls of ``work`` while eight chats run on the model ``chat``: their
    results, once every chat finished normally (none starved, none failed)."""

    def chat(i: int) -> str | None:
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"count to {i}"}], max_tokens=24
        )
        return reply.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(count + 8) as pool:
        results = pool.map(work, range(count))
        reasons = pool.map(chat, range(8))
        out = list(results)
        assert all(r in ("stop", "length") for r in reasons)
    return out
