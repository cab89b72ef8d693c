"""The server's /openapi.json is a contract: the bodies its schemas allow are the ones the
server takes, and the ones they refuse get a 4xx (never a 500).

Each case below was a disagreement Schemathesis found (``make reliability``, part
``contract``); the test asks both the document (validated with ``jsonschema_rs``) and the
real server, and they must agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import jsonschema_rs
import pytest

if TYPE_CHECKING:
    from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": "Bearer test-key"}  # as qwen_server in conftest.py
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def http(qwen_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=qwen_server.base_url, headers=AUTH, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def document(http: httpx.Client) -> dict[str, Any]:
    return http.get("/openapi.json").json()  # type: ignore[no-any-return]


def allowed(document: dict[str, Any], path: str, body: dict[str, Any]) -> bool:
    """Whether the document's request schema for ``POST path`` admits ``body``."""
    ref = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    schema = {**ref["schema"], "components": document["components"]}
    return bool(jsonschema_rs.validator_for(schema).is_valid(body))


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, "max_tokens": 2, **fields}


def tool(**function: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", **function}}]


def messages(*content: Any, role: str = "user", **fields: Any) -> dict[str, Any]:
    return {"max_tokens": 2, "messages": [{"role": role, "content": list(content)}], **fields}


def assistant_call(**call: Any) -> dict[str, Any]:
    """An assistant turn with one tool call (``call`` fields beside ``function``)."""
    return {"role": "assistant", "tool_calls": [{"function": {"name": "f"}, **call}]}


CASES = [
    # (path, body, the server and the document take it)
    (CHAT, chat(min_tokens=1.0), True),  # JSON does not tell 1 from 1.0
    (CHAT, chat(tools=tool(description=None)), True),
    (CHAT, chat(tools=tool(description={})), False),
    (CHAT, chat(tools=tool(parameters=[None, None])), False),
    (
        CHAT,
        chat(
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": "f", "arguments": [None]}}],
                },
            ]
        ),
        False,
    ),
    (
        CHAT,
        chat(messages=[*USER, {"role": "assistant", "tool_calls": [{"function": {"name": ""}}]}]),
        False,
    ),
    (
        CHAT,
        chat(
            messages=[
                *USER,
                {"role": "assistant", "tool_calls": [{"type": 1, "function": {"name": "f"}}]},
            ]
        ),
        False,
    ),
    (COMPLETIONS, {"prompt": [52.0, 7], "max_tokens": 2}, True),
    (EMBEDDINGS, {"input": [217, 622.0]}, True),
    (MESSAGES, {"max_tokens": 2, "messages": USER, "system": [{}]}, False),
    (MESSAGES, messages({}, role="assistant"), False),
    (MESSAGES, messages({"type": "tool_result", "tool_use_id": "t", "content": [[None]]}), False),
    (MESSAGES, messages({"type": "tool_result", "tool_use_id": "t", "content": None}), True),
    (MESSAGES, messages(), True),  # no blocks reads as empty text
    (MESSAGES, {"max_tokens": 2, "messages": USER, "tool_choice": {"type": "text"}}, False),
    (MESSAGES, {"max_tokens": 2, "messages": USER, "tool_choice": {"type": "tool"}}, False),
    (RESPONSES, {"input": [{"type": "message", "role": {}, "content": ""}]}, False),
    (RESPONSES, {"input": [{"type": "message", "role": "user", "content": None}]}, False),
    (RESPONSES, {"input": "hi", "background": True}, False),
    (RESPONSES, {"input": "hi", "tool_choice": {}}, False),
    (RESPONSES, {"input": "hi", "tools": [{}]}, False),
    (RESPONSES, {"input": "hi", "tools": [{"type": 5, "name": "f"}]}, False),
    (RESPONSES, {"input": "hi", "n": 2}, False),
    (RESPONSES, {"input": "hi", "tools": [{"type": "namespace", "tools": [None]}]}, False),
    (RESPONSES, {"input": "hi", "max_output_tokens": 2.0}, True),
    (RESPONSES, {"input": [{"type": "reasoning", "summary": []}]}, False),  # nothing to answer
    (CHAT, chat(messages=[*USER, assistant_call(id={})]), False),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "seed": 2**64 - 1}, True),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "seed": -(2**63) - 1}, False),
    (CHAT, chat(messages=[*USER, assistant_call(id=None)]), True),
    (RESPONSES, {"input": "hi", "tools": [{"type": "namespace", "tools": [{}]}]}, False),
    (
        RESPONSES,
        {"input": "hi", "tools": [{"type": "namespace", "tools": [{"type": "namespace"}]}]},
        False,
    ),
    (RESPONSES, {"input": [{"type": "reasoning"}, {"role": "user", "content": "hi"}]}, True),
    # rules between fields, stated in the document (issue 61)
    (CHAT, chat(tool_choice="required"), False),
    (CHAT, chat(tool_choice="required", tools=[]), False),
    (CHAT, chat(tool_choice="none"), True),
    (CHAT, chat(tool_choice={"type": "function", "function": {}}, tools=tool()), False),
    (CHAT, chat(top_logprobs=2), False),
    (CHAT, chat(top_logprobs=2, logprobs=True), True),
    (CHAT, chat(messages=[{"role": "system", "content": "s", "tool_calls": [{}]}, *USER]), False),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "guided_grammar": ""}, False),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "guided_choice": []}, False),
    (RESPONSES, {"input": "hi", "tool_choice": "required"}, False),
    (
        RESPONSES,
        {"input": "hi", "tool_choice": {"type": "allowed_tools", "mode": "required"}},
        False,
    ),
    (RESPONSES, {"input": "hi", "tool_choice": {"type": "allowed_tools", "mode": "auto"}}, True),
    (MESSAGES, {"max_tokens": 2, "messages": USER, "tool_choice": {"type": "any"}}, False),
    (MESSAGES, {"max_tokens": 2, "messages": USER, "tool_choice": {"type": "auto"}}, True),
    ("/tokenize", {"prompt": "hi", "messages": USER}, False),
    ("/tokenize", {"prompt": None, "messages": USER}, True),
    ("/tokenize", {"content": "hi"}, True),
    ("/tokenize", {}, False),
    ("/api/show", {"name": "tiny-qwen3"}, True),
    ("/api/show", {"model": ""}, False),
    ("/api/embed", {"model": "tiny-qwen3", "input": []}, False),
    (
        "/api/generate",
        {"model": "tiny-qwen3", "prompt": "hi", "keep_alive": "5 m", "stream": False},
        False,
    ),
]


@pytest.mark.parametrize(("path", "body", "takes"), CASES)
def test_the_document_and_the_server_agree(
    http: httpx.Client, document: dict[str, Any], path: str, body: dict[str, Any], takes: bool
) -> None:
    if path == RESPONSES:
        body = {"max_output_tokens": 2, **body}
    assert allowed(document, path, body) is takes
    status = http.post(path, json=body).status_code
    assert status == (200 if takes else 400), status


def test_the_models_bounds_are_in_the_document(
    http: httpx.Client, document: dict[str, Any]
) -> None:
    """Token ids stop at the vocabulary and generation budgets at the context, as the
    server's own checks do."""
    schemas = document["components"]["schemas"]
    stop_ids = schemas["ChatCompletionRequest"]["properties"]["stop_token_ids"]
    top = next(b["items"]["maximum"] for b in stop_ids["anyOf"] if b.get("type") == "array")
    assert allowed(document, CHAT, chat(stop_token_ids=[top]))
    assert not allowed(document, CHAT, chat(stop_token_ids=[top + 1]))
    assert http.post(CHAT, json=chat(stop_token_ids=[top])).status_code == 200
    assert http.post(CHAT, json=chat(stop_token_ids=[top + 1])).status_code == 400
    budget = next(
        b["maximum"]
        for b in schemas["ChatCompletionRequest"]["properties"]["max_tokens"]["anyOf"]
        if b.get("type") == "integer"
    )
    served = http.get("/v1/models").json()["data"][0]
    assert budget == served["context_length"] - 1
    assert not allowed(document, CHAT, chat(max_tokens=budget + 1))


def test_every_answer_a_route_gives_is_documented(
    http: httpx.Client, document: dict[str, Any]
) -> None:
    """Path parameters are declared; a finished response cannot be cancelled (409, in the
    document)."""
    cancel = document["paths"]["/v1/responses/{response_id}/cancel"]["post"]
    assert [p["name"] for p in cancel["parameters"]] == ["response_id"]
    assert {"409", "429", "503"} <= set(cancel["responses"])
    done = http.post(RESPONSES, json={"input": "hi", "max_output_tokens": 2}).json()
    reply = http.post(f"/v1/responses/{done['id']}/cancel")
    assert reply.status_code == 409
    assert reply.json()["error"]["code"] == "conflict"
