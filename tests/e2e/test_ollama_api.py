"""Ollama's API (the ``ollama`` plugin) through the official ``ollama`` Python client,
against the shared scripted server (a real tiny Qwen3; ``options.test_script`` makes it
write a chosen text, so thinking and tool calls go through the real parsers).

Greedy answers must equal the same request on ``/v1/chat/completions``: both front ends
build their requests with the same builder and read the same output pipeline."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import openai
import pytest

from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

MODEL = "tiny"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
API_KEY = "test-key"  # the key of conftest.py's qwen_server
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(scripted_server: Server) -> ollama.Client:
    return ollama.Client(host=scripted_server.base_url, timeout=120)


def test_greedy_chat_equals_the_openai_route_streamed_or_not(
    client: ollama.Client, scripted_server: Server
) -> None:
    options = {"temperature": 0, "num_predict": 12}
    whole = client.chat(model=MODEL, messages=ASK, options=options, think=False)
    oai = openai.OpenAI(base_url=scripted_server.v1, api_key="x", max_retries=0)
    reference = oai.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=12, temperature=0,  # type: ignore[arg-type]
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    assert whole.message.content == reference.choices[0].message.content
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 12
    assert whole.prompt_eval_count == reference.usage.prompt_tokens  # type: ignore[union-attr]
    assert whole.total_duration and whole.total_duration >= (whole.eval_duration or 0) > 0
    parts = list(client.chat(model=MODEL, messages=ASK, options=options, think=False, stream=True))
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 12
    scored = client.chat(model=MODEL, messages=ASK, options=options, think=False,
                         logprobs=True, top_logprobs=2)  # fmt: skip
    assert len(scored.logprobs or []) == 12 and scored.message.content == whole.message.content
    first = (scored.logprobs or [])[0]
    assert first.logprob <= 0 and len(first.top_logprobs or []) == 2
    assert first.logprob == pytest.approx((first.top_logprobs or [])[0].logprob)  # greedy


def test_generate_renders_the_prompt_as_a_user_turn(client: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 8}
    answer = client.generate(model=MODEL, prompt="What is the capital of France?",
                             options=options, think=False)  # fmt: skip
    chat = client.chat(model=MODEL, messages=ASK, options=options, think=False)
    assert answer.response == chat.message.content and answer.done
    streamed = client.generate(model=MODEL, prompt="What is the capital of France?",
                               options=options, think=False, stream=True)  # fmt: skip
    assert "".join(p.response for p in streamed) == answer.response
    scripted = client.generate(model=MODEL, prompt="hi", options={"test_script": "Hello."})
    assert scripted.response == "Hello." and scripted.done_reason == "stop"


def test_think_splits_the_reasoning_from_the_answer(client: ollama.Client) -> None:
    script = {"test_script": "<think>Paris is the capital.</think>Paris"}
    answer = client.chat(model=MODEL, messages=ASK, options=script, think=True)
    assert answer.message.thinking == "Paris is the capital."
    assert answer.message.content == "Paris"
    parts = list(client.chat(model=MODEL, messages=ASK, options=script, think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == "Paris is the capital."
    assert "".join(p.message.content or "" for p in parts) == "Paris"


def test_a_tool_call_comes_back_with_object_arguments(client: ollama.Client) -> None:
    options = {"test_script": CALL}
    answer = client.chat(model=MODEL, messages=ASK, tools=[WEATHER], options=options)
    (call,) = answer.message.tool_calls or []
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert answer.message.content == "" and answer.done_reason == "stop"
    parts = list(client.chat(model=MODEL, messages=ASK, tools=[WEATHER], options=options,
                             stream=True))  # fmt: skip
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    # the call and its result sent back render as the model's own turns
    result = {"role": "tool", "content": "18 C", "tool_name": "get_weather"}
    history: list[Any] = [*ASK, answer.message, result]
    follow = client.chat(model=MODEL, messages=history, tools=[WEATHER],
                         options={"test_script": "It is 18 C."})  # fmt: skip
    assert follow.message.content == "It is 18 C."
    assert (follow.prompt_eval_count or 0) > (answer.prompt_eval_count or 0)


def test_format_json_schema_output_parses(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Lyon"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    answer = client.chat(model=MODEL, messages=ASK, format=schema, think=False,
                         options={"temperature": 0, "num_predict": 40})  # fmt: skip
    value = json.loads(answer.message.content or "")
    assert value["city"] in ("Paris", "Lyon") and isinstance(value["sunny"], bool)
    assert answer.done_reason == "stop"
    # "json": any object (scripted: the random model would wander inside a string)
    loose = client.generate(model=MODEL, prompt="Any JSON", format="json", think=False,
                            options={"test_script": '{"a": [1, 2]}'})  # fmt: skip
    assert json.loads(loose.response) == {"a": [1, 2]}


def test_model_routes_list_show_ps_and_version(
    client: ollama.Client, scripted_server: Server
) -> None:
    listed = client.list()
    names = [m.model for m in listed.models]
    assert MODEL in names
    entry = listed.models[names.index(MODEL)]
    assert entry.details is not None and entry.details.family == "qwen3"
    assert entry.size and entry.size > 0
    shown = client.show(MODEL)
    assert "completion" in (shown.capabilities or []) and "thinking" in (shown.capabilities or [])
    assert "tools" in (shown.capabilities or []) and "<|im_start|>" in (shown.template or "")
    assert (shown.modelinfo or {})["general.architecture"] == "qwen3"
    running = client.ps()
    assert [m.model for m in running.models] == [MODEL]
    assert (running.models[0].context_length or 0) > 0
    assert httpx.get(f"{scripted_server.base_url}/api/version").json()["version"]
    # Ollama's tag suffix reaches the same model
    tagged = client.generate(model=MODEL + ":latest", prompt="x", options={"test_script": "ok"})
    assert tagged.response == "ok"


def test_embed_returns_unit_vectors_and_the_old_route_one_vector(client: ollama.Client) -> None:
    out = client.embed(model=MODEL, input=["hello", "world"])
    assert len(out.embeddings) == 2 and out.embeddings[0] != out.embeddings[1]
    for vector in out.embeddings:
        assert abs(sum(x * x for x in vector) - 1.0) < 1e-4
    cut = client.embed(model=MODEL, input="hello", dimensions=8)
    assert len(cut.embeddings[0]) == 8
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model=MODEL, input="hello", dimensions=2**64)
    assert err.value.status_code == 400 and "dimensions" in err.value.error
    single = client.embeddings(model=MODEL, prompt="hello")
    norm = sum(x * x for x in single.embedding) ** 0.5
    assert [round(x / norm, 5) for x in single.embedding] == [
        round(x, 5) for x in out.embeddings[0]
    ]


def test_empty_requests_load_and_keep_alive_zero_unloads(
    client: ollama.Client, scripted_server: Server
) -> None:
    loaded = client.generate(model=MODEL)
    assert loaded.done and loaded.done_reason == "load"
    # the only model of this server: unloading it is Ollama's `ollama stop`
    stopped = client.chat(model=MODEL, messages=[], keep_alive=0)
    assert stopped.done_reason == "unload"
    assert client.ps().models == []
    again = client.chat(model=MODEL, messages=ASK, options={"test_script": "back"})
    assert again.message.content == "back" and [m.model for m in client.ps().models] == [MODEL]


@pytest.mark.parametrize(
    ("call", "status", "says"),
    [
        ({"options": {"temperature": "hot"}}, 400, "option temperature must be a number"),
        ({"options": {"temperature": 9}}, 400, "option temperature"),
        ({"options": {"repeat_penalty": 0}}, 400, "option repeat_penalty"),
        ({"options": {"num_predict": 0}}, 400, "num_predict"),
        ({"options": {"num_ctx": 10**9}}, 400, "num_ctx"),
        ({"options": {"mirostat": 2}}, 400, "mirostat is not supported"),
        ({"options": {"stop": [1]}}, 400, "option stop"),
        ({"format": {"type": "object", "properties": 3}}, 400, "format"),
        ({"think": "very"}, 400, "think"),
        ({"keep_alive": "soon", "messages": []}, 400, "keep_alive"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400, "images"),
        ({"tools": [{"type": "function", "function": {}}]}, 400, "name"),
    ],
)
def test_bad_requests_are_ollama_shaped_4xx(
    client: ollama.Client, call: dict[str, Any], status: int, says: str
) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": ASK, **call}
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(**kwargs)
    assert err.value.status_code == status and says in err.value.error, err.value.error


def test_an_unknown_model_is_a_404(qwen_server: Server) -> None:
    keyed = ollama.Client(host=qwen_server.base_url, headers={"Authorization": f"Bearer {API_KEY}"})
    with pytest.raises(ollama.ResponseError) as err:
        keyed.chat(model="no-such-model", messages=ASK)
    assert err.value.status_code == 404 and "no-such-model" in err.value.error
    assert keyed.chat(model="tiny-qwen3:latest", messages=ASK, options={"num_predict": 2}).done


def test_malformed_bodies_get_an_error_object(scripted_server: Server) -> None:
    url = f"{scripted_server.base_url}/api/chat"
    bodies = (b"{", b'{"model": 3}', b'{"model": "tiny", "messages": "x"}', b"[]",
              b'{"model": "tiny", "messages": [{"role": "user"}], "format": "yaml"}')  # fmt: skip
    for body in bodies:
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and set(r.json()) == {"error"}, (body, r.text)
    r = httpx.post(f"{scripted_server.base_url}/api/generate", json={"model": "tiny",
                   "prompt": "x", "context": [1, 2]})  # fmt: skip
    assert r.status_code == 400 and "api/chat" in r.json()["error"]
