"""The Responses API's conversation store is a budget: bytes, time since last use, and
chains that stay whole while they are used."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from mlxcore.builtin.openai.responses.items import (
    chat_messages,
    decode_reasoning,
    encode_reasoning,
    item_size,
)
from mlxcore.builtin.openai.responses.store import ResponseStore
from mlxcore.server.errors import APIError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def turn(rid: str, text: str) -> tuple[dict[str, Any], list[Any], list[Any]]:
    inputs = [{"type": "message", "role": "user", "content": text}]
    outputs = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    ]
    return {"id": rid, "object": "response"}, inputs, outputs


def test_the_byte_budget_evicts_least_recently_used_first() -> None:
    response, inputs, outputs = turn("a", "x" * 100)
    one = item_size(response) + item_size(inputs) + item_size(outputs)
    store = ResponseStore(max_bytes=one * 2 + 10, ttl=0)
    store.put(*turn("a", "x" * 100), None)
    store.put(*turn("b", "x" * 100), None)
    store.get("a")  # a used: b is now the least recently used
    store.put(*turn("c", "x" * 100), None)
    assert store.bytes <= store.max_bytes and len(store) == 2
    store.get("a")
    store.get("c")
    with pytest.raises(APIError) as err:
        store.get("b")
    assert err.value.status == 404 and err.value.code == "response_not_found"
    # one response larger than the whole budget is not stored at all
    assert not store.put(*turn("huge", "y" * (one * 3)), None)
    assert len(store) == 2


def test_entries_unused_for_the_ttl_expire() -> None:
    clock = Clock()
    store = ResponseStore(max_bytes=10**6, ttl=60, clock=clock)
    store.put(*turn("a", "hi"), None)
    store.put(*turn("b", "hi"), None)
    clock.now = 50
    store.get("b")
    clock.now = 100
    store.get("b")
    with pytest.raises(APIError):
        store.get("a")
    assert store.bytes == sum(e.size for e in store._entries.values())


def test_a_conversation_is_the_chain_of_links_and_a_missing_link_is_a_404() -> None:
    store = ResponseStore(max_bytes=10**6, ttl=0)
    store.put(*turn("r1", "one"), None)
    store.put(*turn("r2", "two"), "r1")
    store.put(*turn("r3", "three"), "r2")
    items = store.conversation("r3", "previous_response_id")
    texts = [
        i["content"] if isinstance(i["content"], str) else i["content"][0]["text"] for i in items
    ]
    assert texts == ["one", "one", "two", "two", "three", "three"]
    messages = chat_messages(items)
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3
    store.delete("r2")
    with pytest.raises(APIError) as err:
        store.conversation("r3", "previous_response_id")
    assert err.value.param == "previous_response_id"


def test_reasoning_round_trips_and_foreign_blobs_are_ignored() -> None:
    assert decode_reasoning(encode_reasoning("think ünï")) == "think ünï"
    assert decode_reasoning("gAAAA-someone-elses-encrypted-blob") is None
    assert decode_reasoning("mlxcore-reasoning:not base64!") is None
    items = [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [], "encrypted_content": encode_reasoning("hmm")},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    user, assistant, tool = chat_messages(items)
    assert user == {"role": "user", "content": "hi"}
    assert assistant["reasoning_content"] == "hmm"
    assert assistant["tool_calls"][0]["function"] == {"name": "f", "arguments": {"a": 1}}
    assert tool == {"role": "tool", "tool_call_id": "c1", "content": "done"}


def test_a_warning_about_what_clients_keep_sending_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from mlxcore.request_builder import warn_once

    caplog.set_level(logging.DEBUG, logger="mlxcore.server")
    for _ in range(3):
        warn_once("test-once-key", "skipped %s", "web_search")
    levels = [r.levelno for r in caplog.records if r.getMessage() == "skipped web_search"]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


def test_warnings_about_client_input_stay_bounded_under_a_flood(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 never-seen field names: the remembered names stop at WARNED_KEYS and the
    warning lines at WARNED_KEYS + 1 (one summary for the rest within a minute), and a
    warning of another case still comes out at once."""
    from mlxcore import request_builder as rb

    monkeypatch.setattr(rb, "_warned", rb._OnceLog())
    caplog.set_level(logging.DEBUG, logger="mlxcore.server")
    for i in range(20_000):
        rb.warn_once(f"unknown-field:f{i}", "request field %r is ignored", f"f{i}")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(rb._warned.cases["unknown-field"].keys) == rb.WARNED_KEYS
    assert len(warnings) == rb.WARNED_KEYS + 1
    assert "f0" in warnings[0].getMessage()
    assert "'f256'" in warnings[-1].getMessage()  # the first case past the bound, alone
    rb.warn_once("other-case", "a server-side fact")  # another case is not crowded out
    assert caplog.records[-1].levelno == logging.WARNING
    rb._warned.cases["unknown-field"].last_summary -= rb.NEW_CASES_EVERY_S  # a minute later
    caplog.clear()
    rb.warn_once("unknown-field:late", "request field %r is ignored", "late")
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "'late'" in line and "19743 more such warnings" in line
    rb.warn_once("unknown-field:f3", "request field %r is ignored", "f3")  # a known case
    assert [r.levelno for r in caplog.records][-1] == logging.DEBUG
