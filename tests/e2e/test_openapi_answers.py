"""What the routes answer is what /openapi.json says they answer: every 200 (and /health's
503) has a documented content type and schema, and real answers of every shape (tool
calls, reasoning, logprobs, several choices, base64 embeddings, stored responses) match
it. Schemathesis checks the same over generated requests (``make reliability``, part
``contract``); this test covers the shapes random requests rarely reach.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import jsonschema_rs
import pytest

if TYPE_CHECKING:
    from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

THINK_AND_CALL = (
    "<think>\nI should look it up.\n</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
USER = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def http(scripted_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=scripted_server.base_url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def document(http: httpx.Client) -> dict[str, Any]:
    return http.get("/openapi.json").json()  # type: ignore[no-any-return]


def check(
    document: dict[str, Any], method: str, path: str, answer: httpx.Response
) -> dict[str, Any]:
    """``answer`` (to ``method path``, a path template) has a documented status and content
    type, and its JSON body matches the documented schema; the body."""
    responses = document["paths"][path][method.lower()]["responses"]
    assert str(answer.status_code) in responses, (method, path, answer.status_code)
    content = responses[str(answer.status_code)].get("content", {})
    media_type = answer.headers["content-type"].split(";")[0].strip()
    assert media_type in content, (method, path, media_type, list(content))
    schema = content[media_type]["schema"]
    if media_type == "text/event-stream":
        events = server_sent_events(answer.text)
        assert events, (method, path)
        for event in events:
            check_event(schema, event, document["components"])
        return {}
    if media_type == "application/x-ndjson":  # Ollama's streams: every line an object
        lines = [json.loads(line) for line in answer.text.splitlines() if line]
        assert lines and lines[-1]["done"] is True, (method, path)
        for line in lines:
            matches(schema, line, document["components"])
        return {}
    if media_type != "application/json":
        return {}
    body: dict[str, Any] = answer.json()
    matches(schema, body, document["components"])
    return body


def matches(schema: dict[str, Any], value: Any, components: dict[str, Any]) -> None:
    validator = jsonschema_rs.validator_for({**schema, "components": components})
    errors = [str(e) for e in validator.iter_errors(value)]
    assert not errors, (errors[:3], value)


def server_sent_events(text: str) -> list[dict[str, str]]:
    """The events of a stream as a client reads them (``event`` defaults to ``message``;
    comments such as keep-alives are skipped)."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if "data" in fields:
            events.append({"event": fields.get("event", "message"), "data": fields["data"]})
    return events


def check_event(schema: dict[str, Any], event: dict[str, str], components: dict[str, Any]) -> None:
    """One event against its documented schema: its fields, then its data (JSON that
    matches ``contentSchema``, unless it is the stream's closing word such as ``[DONE]``)."""
    matches(schema, event, components)
    data = schema["properties"]["data"]
    if "else" in schema:
        if event["data"] == schema["if"]["properties"]["data"]["const"]:
            return
        data = schema["else"]["properties"]["data"]
    assert data["contentMediaType"] == "application/json"
    matches(data["contentSchema"], json.loads(event["data"]), components)


def test_every_success_is_documented(document: dict[str, Any]) -> None:
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            ok = operation["responses"]["200"]
            assert ok.get("content"), (method, path)
    streaming = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
    for path in streaming:
        content = document["paths"][path]["post"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/event-stream"}, path


def test_ollama_routes(http: httpx.Client, document: dict[str, Any]) -> None:
    ask = {"model": "tiny", "messages": USER, "options": {"test_script": THINK_AND_CALL}}
    tools = [{"type": "function", "function": WEATHER}]
    body = check(document, "POST", "/api/chat", http.post("/api/chat", json={**ask,
                 "tools": tools, "stream": False}))  # fmt: skip
    assert body["message"]["tool_calls"] and body["message"]["thinking"]
    check(document, "POST", "/api/chat", http.post("/api/chat", json={**ask, "tools": tools}))
    said = {"model": "tiny", "prompt": "hi", "options": {"test_script": "<think>a</think>b"}}
    body = check(document, "POST", "/api/generate", http.post("/api/generate", json={**said,
                 "stream": False}))  # fmt: skip
    assert body["thinking"] == "a" and body["response"] == "b"
    check(document, "POST", "/api/generate", http.post("/api/generate", json=said))
    loaded = check(document, "POST", "/api/generate", http.post("/api/generate",
                   json={"model": "tiny", "stream": False}))  # fmt: skip
    assert loaded["done_reason"] == "load"
    check(document, "POST", "/api/embed", http.post("/api/embed", json={"model": "tiny",
          "input": ["a", "b"]}))  # fmt: skip
    check(document, "POST", "/api/embeddings", http.post("/api/embeddings", json={"model": "tiny",
          "prompt": "a"}))  # fmt: skip
    for path in ("/api/tags", "/api/ps", "/api/version"):
        check(document, "GET", path, http.get(path))
    check(document, "POST", "/api/show", http.post("/api/show", json={"model": "tiny"}))
    error = http.post("/api/chat", json={**ask, "options": {"top_k": "x"}})
    assert error.status_code == 400
    matches(document["components"]["schemas"]["Error"], error.json(), document["components"])


def test_server_and_model_routes(http: httpx.Client, document: dict[str, Any]) -> None:
    check(document, "GET", "/", http.get("/"))
    health = check(document, "GET", "/health", http.get("/health"))
    assert health["status"] == "ok"
    models = check(document, "GET", "/v1/models", http.get("/v1/models"))
    name = models["data"][0]["id"]
    check(document, "GET", "/v1/models/{model_id}", http.get(f"/v1/models/{name}"))
    check(document, "POST", "/v1/models/{model_id}/load", http.post(f"/v1/models/{name}/load"))
    check(document, "GET", "/metrics", http.get("/metrics"))
    history = check(document, "GET", "/metrics/history", http.get("/metrics/history?seconds=60"))
    assert history["window_seconds"] == 900


def test_chat_and_completions(http: httpx.Client, document: dict[str, Any]) -> None:
    path = "/v1/chat/completions"
    calls = {
        "messages": USER,
        "max_tokens": 60,
        "tools": [{"type": "function", "function": WEATHER}],
        "test_script": THINK_AND_CALL,
        "logprobs": True,
        "top_logprobs": 2,
    }
    body = check(document, "POST", path, http.post(path, json=calls))
    message = body["choices"][0]["message"]
    assert message["tool_calls"] and message["reasoning_content"]
    body = check(document, "POST", path, http.post(path, json={**calls, "n": 2}))
    assert len(body["choices"]) == 2
    check(document, "POST", path, http.post(path, json={**calls, "stream": True}))
    path = "/v1/completions"
    text = {"prompt": "Once", "max_tokens": 3, "logprobs": 2, "echo": True}
    body = check(document, "POST", path, http.post(path, json=text))
    assert body["choices"][0]["logprobs"]["tokens"]
    check(document, "POST", path, http.post(path, json={**text, "stream": True}))
    path = "/v1/embeddings"
    for encoding in ("float", "base64"):
        vectors = {"input": ["a", "b"], "encoding_format": encoding}
        check(document, "POST", path, http.post(path, json=vectors))


def test_responses(http: httpx.Client, document: dict[str, Any]) -> None:
    path = "/v1/responses"
    ask = {
        "input": "weather in Paris?",
        "max_output_tokens": 60,
        "tools": [{"type": "function", **WEATHER}],
        "test_script": THINK_AND_CALL,
    }
    body = check(document, "POST", path, http.post(path, json=ask))
    assert {item["type"] for item in body["output"]} == {"reasoning", "function_call"}
    check(document, "POST", path, http.post(path, json={**ask, "stream": True}))
    one = "/v1/responses/{response_id}"
    stored = f"/v1/responses/{body['id']}"
    check(document, "GET", one, http.get(stored))
    items = check(document, "GET", one + "/input_items", http.get(stored + "/input_items"))
    assert items["data"]
    check(document, "POST", one + "/cancel", http.post(stored + "/cancel"))  # 409
    check(document, "DELETE", one, http.delete(stored))
    check(document, "GET", one, http.get(stored))  # 404 now


def test_messages(http: httpx.Client, document: dict[str, Any]) -> None:
    path = "/v1/messages"
    ask = {
        "max_tokens": 60,
        "messages": USER,
        "tools": [{"name": WEATHER["name"], "input_schema": WEATHER["parameters"]}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "test_script": THINK_AND_CALL,
    }
    body = check(document, "POST", path, http.post(path, json=ask))
    assert [block["type"] for block in body["content"]] == ["thinking", "tool_use"]
    check(document, "POST", path, http.post(path, json={**ask, "stream": True}))
    count = {"messages": USER}
    path = "/v1/messages/count_tokens"
    check(document, "POST", path, http.post(path, json=count))
