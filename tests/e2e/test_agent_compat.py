"""What agent clients send, over HTTP with the official ``openai`` client.

A Qwen3.5 server (thinking on by default in its template) started the way an agent user
would: ``--default-chat-template-kwargs '{"enable_thinking": false}'`` and
``--accept-any-model-name``, no ``--served-model-name``. Checked: the served name is the
model's name (not a path), any name is served and echoed, the server-side template
default applies unless the request sets its own, system messages in the middle of a
conversation and consecutive user messages keep the previous turn a cached prefix.
(``--refuse-unrenderable-tools`` is tested on the embedded default model's server in
test_greedy_identity.py: its template has no tools.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest

if TYPE_CHECKING:
    from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

LONG = "Here is the context of the task. " * 12
GENERATION_PROMPT = 8
"""Tokens of Qwen3.5's generation prompt without thinking (``<|im_start|>assistant\n
<think>\n\n</think>\n\n``, 7) and a margin: the end of a turn's prompt that the next
turn's history does not repeat, so it is never cached."""


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3_5: Path) -> Server:
    return mlxcore_server(
        tiny_qwen3_5,
        "--plugin",
        "mlxcore.testing.scripted",
        "--default-chat-template-kwargs",
        '{"enable_thinking": false}',
        "--accept-any-model-name",
    )


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=120) as c:
        yield c


def chat(client: openai.OpenAI, script: str, messages: list[Any], **kwargs: Any) -> Any:
    body = {"test_script": script, **kwargs.pop("extra_body", {})}
    kwargs.setdefault("model", "gpt-5")
    return client.chat.completions.create(
        messages=messages, max_tokens=32, temperature=0, extra_body=body, **kwargs
    )


def test_served_name_is_the_models_name_and_any_name_is_served(
    client: openai.OpenAI, tiny_qwen3_5: Path
) -> None:
    (listed,) = client.models.list().data
    assert listed.id == tiny_qwen3_5.name and "/" not in listed.id
    reply = chat(client, "Hi.", [{"role": "user", "content": "Hello"}], model="claude-sonnet-4-6")
    assert reply.model == "claude-sonnet-4-6"
    assert reply.choices[0].message.content == "Hi."


def test_server_default_template_kwargs_apply_unless_the_request_sets_them(
    client: openai.OpenAI,
) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    plain = chat(client, "Hello back.", messages).choices[0].message
    assert plain.content == "Hello back."
    assert not getattr(plain, "reasoning_content", None)
    thinking = (
        chat(
            client,
            "Let me think.\n</think>\n\nHello back.",
            messages,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        .choices[0]
        .message
    )
    assert thinking.content == "Hello back."
    assert thinking.reasoning_content.strip() == "Let me think."  # type: ignore[attr-defined]


def test_a_system_message_mid_conversation_keeps_the_history_cached(
    client: openai.OpenAI,
) -> None:
    history: list[Any] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": LONG + "What is 2+2?"},
    ]
    first = chat(client, "Four.", history)
    follow = chat(
        client,
        "Six.",
        [
            *history,
            {"role": "assistant", "content": "Four."},
            {"role": "system", "content": "Reminder: stay terse."},
            {"role": "user", "content": "And 3+3?"},
        ],
    )
    assert follow.choices[0].message.content == "Six."
    cached = follow.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - GENERATION_PROMPT


def test_consecutive_user_messages_stay_apart_so_the_next_turn_hits_the_cache(
    client: openai.OpenAI,
) -> None:
    """Codex (chat wire API) resumes a session by appending a user message right after
    the previous one; merging the two would rewrite the history already cached."""
    turn: list[Any] = [
        {"role": "user", "content": LONG + "<environment_context>cwd=/tmp</environment_context>"}
    ]
    first = chat(client, "Hello.", turn)
    second = chat(client, "Bye.", [*turn, {"role": "user", "content": "Say hello"}])
    assert second.choices[0].message.content == "Bye."
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - GENERATION_PROMPT
