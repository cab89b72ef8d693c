"""A tool call written through prompt-lookup speculation, end to end: a real server with
the plugin on, the official ``openai`` client, the scripted test plugin making the tiny
Qwen3 model repeat a tool call that is already in its history (so the lookup drafts it
and the drafts are accepted); the parsers see only verified tokens, streamed and not."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from mlxcore.testing.conformance import DEFAULT_TOOLS

if TYPE_CHECKING:
    from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

ARGS = {"city": "Paris", "days": 3}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(ARGS) + "}\n</tool_call>"
SCRIPT = "<think>\n\n</think>\n\n" + CALL

MESSAGES: list[Any] = [
    {"role": "user", "content": "Weather in Paris for three days?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(ARGS)},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "error: try again"},
    {"role": "user", "content": "Please call it again."},
]


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3: Path) -> Server:
    return mlxcore_server(
        tiny_qwen3,
        "--served-model-name", "tiny",
        "--plugin", "mlxcore.testing.scripted",
        "--plugin", "prompt-lookup",
    )  # fmt: skip


def accepted_drafts(server: Server) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    match = re.search(r"^\S*speculative_accepted\S* (\S+)$", text, re.MULTILINE)
    assert match, "no speculative_accepted metric"
    return float(match.group(1))


def test_a_tool_call_copied_from_the_history_is_parsed_from_verified_tokens(
    server: Server,
) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
    body: dict[str, Any] = {"test_script": SCRIPT}
    before = accepted_drafts(server)
    reply = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=DEFAULT_TOOLS, temperature=0, extra_body=body
    )
    assert accepted_drafts(server) > before  # the call's tokens came through speculation
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", ARGS)
    ]

    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=DEFAULT_TOOLS, temperature=0,
        stream=True, extra_body=body,
    )  # fmt: skip
    names, arguments, content, finish = [], "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            if call.function and call.function.name:
                names.append(call.function.name)
            arguments += (call.function.arguments or "") if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and names == ["get_weather"]
    assert json.loads(arguments) == ARGS and not content.strip()
