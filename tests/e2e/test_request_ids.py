"""``x-request-id`` honoured and echoed on every response (errors too), and the id in the
server's JSON log lines about the request (``--log-format json``)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = [pytest.mark.e2e]

KEY = {"Authorization": "Bearer rid-key"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
NEW_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3: Path) -> Server:
    return mlxcore_server(
        tiny_qwen3,
        "--api-key",
        "rid-key",
        "--log-format",
        "json",
        "--log-level",
        "debug",
    )


def test_a_given_id_is_echoed_on_every_kind_of_answer(server: Server) -> None:
    base = server.base_url
    cases = [
        ("POST", "/v1/chat/completions", KEY, CHAT, 200),
        ("POST", "/v1/chat/completions", KEY, {**CHAT, "stream": True}, 200),
        ("POST", "/v1/chat/completions", {}, CHAT, 401),
        ("POST", "/v1/chat/completions", KEY, {"messages": []}, 400),
        ("GET", "/v1/nowhere", KEY, None, 404),
        ("DELETE", "/v1/models", KEY, None, 405),
        ("GET", "/health", {}, None, 200),
    ]
    for i, (method, path, headers, body, status) in enumerate(cases):
        rid = f"client-id.{i}:x"
        answer = httpx.request(
            method, base + path, headers={**headers, "x-request-id": rid}, json=body, timeout=60
        )
        assert answer.status_code == status, (path, answer.text)
        assert answer.headers["x-request-id"] == rid, path


def test_an_id_is_made_when_none_or_a_bad_one_is_given(server: Server) -> None:
    seen = set()
    for given in (None, "", "has spaces", "x" * 129, 'quote"d'):
        headers = dict(KEY) | ({"x-request-id": given} if given is not None else {})
        answer = httpx.post(f"{server.v1}/chat/completions", headers=headers, json=CHAT)
        assert answer.status_code == 200
        made = answer.headers["x-request-id"]
        assert NEW_ID.fullmatch(made), made
        seen.add(made)
    assert len(seen) == 5


def test_the_official_client_sees_the_id(server: Server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="rid-key", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=4,
        extra_headers={"x-request-id": "sdk-request-7"},
    )
    assert raw.headers["x-request-id"] == "sdk-request-7"
    assert raw.parse().choices[0].finish_reason in ("stop", "length")


def test_json_log_lines_carry_the_request_id(server: Server) -> None:
    rid = "log-line-check-42"
    httpx.post(
        f"{server.v1}/chat/completions", headers={**KEY, "x-request-id": rid}, json=CHAT
    ).raise_for_status()
    deadline = time.monotonic() + 10
    mine: list[dict[str, object]] = []
    while not mine and time.monotonic() < deadline:
        lines = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
        mine = [r for r in lines if r.get("request_id") == rid]
        time.sleep(0.1)
    assert lines and all({"time", "level", "logger", "message"} <= set(r) for r in lines)
    assert any("finished" in str(r["message"]) for r in mine), mine
