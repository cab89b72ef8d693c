"""The official ``openai`` client against a real ``mlxcore serve`` (uvicorn) on tiny_qwen3.

Everything here goes over HTTP to a subprocess: chat and text completions (stream and
non-stream), stop strings, limits, ``n``, logprobs, seeds, model listing, tools in the
request, errors as the client raises them, /health and /metrics, and concurrency.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

if TYPE_CHECKING:
    from mlxcore.testing.server import Server

pytestmark = pytest.mark.e2e

API_KEY = "test-key"  # as qwen_server in conftest.py
MODEL_NAMES = ("tiny-qwen3", "alias-qwen")
MODEL = MODEL_NAMES[0]
PROMPT = "Tell me a story"
TEXT_PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def client(qwen_server: Server) -> Iterator[openai.OpenAI]:
    """An OpenAI client on the shared server; no retries, so a 503 or 500 shows."""
    with openai.OpenAI(base_url=qwen_server.v1, api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


def user(text: str) -> list[dict[str, str]]:
    """A one-message conversation."""
    return [{"role": "user", "content": text}]


def greedy_chat(client: openai.OpenAI, prompt: str = PROMPT, **kwargs: Any) -> Any:
    """A non-stream greedy chat completion."""
    kwargs.setdefault("max_tokens", 24)
    return client.chat.completions.create(
        model=MODEL, messages=user(prompt), temperature=0, **kwargs
    )


def collect_stream(client: openai.OpenAI, **kwargs: Any) -> tuple[list[Any], str]:
    """Every chunk of a chat stream, and choice 0's concatenated content."""
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kwargs))
    text = "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == 0
    )
    return chunks, text


# -- chat completions ---------------------------------------------------------------------


def test_chat_non_stream(client: openai.OpenAI) -> None:
    resp = greedy_chat(client)
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    assert resp.model == MODEL
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = resp.usage
    assert usage is not None
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert isinstance(cached, int) and 0 <= cached <= usage.prompt_tokens


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    full = greedy_chat(client, max_tokens=20)
    chunks, text = collect_stream(
        client,
        messages=user(PROMPT),
        temperature=0,
        max_tokens=20,
        stream_options={"include_usage": True},
    )
    assert text == full.choices[0].message.content
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(finishing) == 1, "exactly one chunk carries the finish_reason"
    assert finishing[0].choices[0].finish_reason == full.choices[0].finish_reason
    # the usage chunk is last, has no choices, and only it has usage
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert last.usage.completion_tokens == full.usage.completion_tokens == 20
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    assert last.usage.prompt_tokens_details is not None
    assert all(c.id == chunks[0].id and c.model == MODEL for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"


def _stop_for(text: str) -> str:
    """Three characters from the second half of ``text`` whose first occurrence is well
    inside it, so a stopped generation has text before the stop string."""
    for i in range(len(text) // 2, len(text) - 3):
        stop = text[i : i + 3]
        if stop.strip() and "\ufffd" not in stop and text.index(stop) >= 3:
            return stop
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_stop_string(client: openai.OpenAI, stream: bool) -> None:
    first = greedy_chat(client, max_tokens=30).choices[0].message.content
    stop = _stop_for(first)
    expected = first[: first.index(stop)]
    assert expected
    if stream:
        chunks, text = collect_stream(
            client, messages=user(PROMPT), temperature=0, max_tokens=30, stop=[stop]
        )
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        finish = [r for r in reasons if r is not None]
    else:
        resp = greedy_chat(client, max_tokens=30, stop=[stop])
        text = resp.choices[0].message.content
        finish = [resp.choices[0].finish_reason]
    assert text == expected
    assert stop not in text
    assert finish == ["stop"]


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    resp = greedy_chat(client, max_tokens=5)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5


def test_max_completion_tokens_is_honoured(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL, messages=user(PROMPT), temperature=0, max_completion_tokens=3
    )
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 3


def test_n_choices_with_seed(client: openai.OpenAI) -> None:
    def run() -> Any:
        return client.chat.completions.create(
            model=MODEL, messages=user(PROMPT), n=2, seed=7, temperature=1.0, max_tokens=12
        )

    first, again = run(), run()
    assert sorted(c.index for c in first.choices) == [0, 1]
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert all(texts) and all(c.finish_reason == "length" for c in first.choices)
    assert texts[0] != texts[1], "the two choices must be sampled independently"
    assert texts == [c.message.content for c in sorted(again.choices, key=lambda c: c.index)]
    assert first.usage.completion_tokens == 24


def test_n_choices_stream(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=user(PROMPT),
            n=2,
            seed=7,
            temperature=1.0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = {0: "", 1: ""}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason is not None:
                finishes[ch.index].append(ch.finish_reason)
    assert finishes == {0: ["length"], 1: ["length"]}
    full = client.chat.completions.create(
        model=MODEL, messages=user(PROMPT), n=2, seed=7, temperature=1.0, max_tokens=12
    )
    assert [texts[0], texts[1]] == [
        c.message.content for c in sorted(full.choices, key=lambda c: c.index)
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_logprobs(client: openai.OpenAI) -> None:
    resp = greedy_chat(client, max_tokens=8, logprobs=True, top_logprobs=3)
    choice = resp.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    items = choice.logprobs.content
    assert len(items) == resp.usage.completion_tokens == 8
    for item in items:
        assert item.logprob <= 0.0
        assert len(item.top_logprobs) == 3
        tops = [t.logprob for t in item.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # greedy: the chosen token is the most likely one
        assert item.token == item.top_logprobs[0].token
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob, abs=1e-4)
        assert item.bytes == list(item.token.encode())
    if not any("\ufffd" in i.token for i in items):
        assert "".join(i.token for i in items) == choice.message.content
    chunks, _ = collect_stream(
        client, messages=user(PROMPT), temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    streamed = [
        item
        for c in chunks
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
        for item in c.choices[0].logprobs.content
    ]
    assert [(i.token, i.logprob) for i in streamed] == [(i.token, i.logprob) for i in items]


def test_completion_logprobs(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=MODEL, prompt=TEXT_PROMPT, temperature=0, max_tokens=6, logprobs=2
    )
    lp = resp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == 6
    assert all(x <= 0.0 for x in lp.token_logprobs)
    assert lp.top_logprobs is not None and len(lp.top_logprobs) == 6
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2
        assert token in top  # greedy: the chosen token is among the top ones


def test_seed_reproducible_at_temperature_1(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        resp = client.chat.completions.create(
            model=MODEL, messages=user(PROMPT), temperature=1.0, seed=seed, max_tokens=16
        )
        text: str = resp.choices[0].message.content
        return text

    a, b, c = sample(1234), sample(1234), sample(4321)
    assert a == b
    assert a != c


def test_tools_in_request_do_not_break_the_call(client: openai.OpenAI) -> None:
    tools: list[Any] = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    resp = client.chat.completions.create(
        model=MODEL,
        messages=user("What is the weather in Paris?"),
        tools=tools,
        tool_choice="auto",
        temperature=0,
        max_tokens=16,
    )
    assert resp.choices[0].finish_reason in ("stop", "length", "tool_calls")
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=user("What is the weather in Paris?"),
            tools=tools,
            temperature=0,
            max_tokens=16,
            stream=True,
        )
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] is not None


# -- models ---------------------------------------------------------------------------------


def test_models_list(client: openai.OpenAI, qwen_server: Server, tiny_qwen3: Path) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == list(MODEL_NAMES)
    raw = httpx.get(
        f"{qwen_server.v1}/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    )
    assert raw.status_code == 200
    body = raw.json()
    assert body["object"] == "list"
    for entry in body["data"]:
        assert entry["object"] == "model"
        assert Path(entry["root"]).resolve() == Path(tiny_qwen3).resolve()


def test_alias_name_is_served_and_echoed(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model=MODEL_NAMES[1], messages=user(PROMPT), temperature=0, max_tokens=4
    )
    assert resp.model == MODEL_NAMES[1]
    assert (
        resp.choices[0].message.content
        == greedy_chat(client, max_tokens=4).choices[0].message.content
    )


# -- text completions -----------------------------------------------------------------------


def test_completions_non_stream_stream_and_echo(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "prompt": TEXT_PROMPT, "temperature": 0}
    plain = client.completions.create(max_tokens=10, **args)
    assert plain.object == "text_completion"
    assert plain.model == MODEL
    text = plain.choices[0].text
    assert text and plain.choices[0].finish_reason == "length"
    assert plain.usage is not None and plain.usage.completion_tokens == 10
    assert plain.usage.total_tokens == plain.usage.prompt_tokens + 10

    chunks = list(
        client.completions.create(
            max_tokens=10, stream=True, stream_options={"include_usage": True}, **args
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f is not None] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 10

    echoed = client.completions.create(max_tokens=10, echo=True, **args)
    assert echoed.choices[0].text == TEXT_PROMPT + text
    echo_chunks = list(client.completions.create(max_tokens=10, echo=True, stream=True, **args))
    assert "".join(c.choices[0].text for c in echo_chunks if c.choices) == TEXT_PROMPT + text


def test_completions_stop(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_tokens": 20}
    text = client.completions.create(prompt=TEXT_PROMPT, **args).choices[0].text
    stop = _stop_for(text)
    stopped = client.completions.create(prompt=TEXT_PROMPT, stop=stop, **args).choices[0]
    assert stopped.text == text[: text.index(stop)]
    assert stopped.finish_reason == "stop"


def test_completions_token_id_prompt(client: openai.OpenAI, tiny_qwen3: Path) -> None:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(tiny_qwen3 / "tokenizer.json")).encode(TEXT_PROMPT).ids
    args: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_tokens": 8}
    by_text = client.completions.create(prompt=TEXT_PROMPT, **args)
    by_ids = client.completions.create(prompt=ids, **args)
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == by_text.choices[0].text
    one_string = client.completions.create(prompt=[TEXT_PROMPT], **args)
    assert one_string.choices[0].text == by_text.choices[0].text


# -- errors through the client --------------------------------------------------------------


def test_wrong_api_key_is_authentication_error(qwen_server: Server) -> None:
    with openai.OpenAI(base_url=qwen_server.v1, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as info:
            bad.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=2)
        assert info.value.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    no_key = httpx.post(f"{qwen_server.v1}/chat/completions", json={}, timeout=10)
    assert no_key.status_code == 401
    assert no_key.json()["error"]["type"] == "authentication_error"


def test_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=user("hi"), max_tokens=2)
    assert info.value.status_code == 404
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)


def test_bad_temperature_is_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL, messages=user("hi"), temperature=5.0, max_tokens=2
        )
    err = info.value
    assert err.status_code == 400
    assert isinstance(err.body, dict) and err.body["param"] == "temperature"
    assert err.response.json()["error"]["param"] == "temperature"
    assert err.body["type"] == "invalid_request_error"


# -- /health and /metrics -------------------------------------------------------------------


def test_health_needs_no_key(qwen_server: Server) -> None:
    r = httpx.get(f"{qwen_server.base_url}/health", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert isinstance(body["running"], int) and isinstance(body["waiting"], int)


def test_metrics_needs_the_key(client: openai.OpenAI, qwen_server: Server) -> None:
    greedy_chat(client, max_tokens=2)
    url = f"{qwen_server.base_url}/metrics"
    denied = httpx.get(url, timeout=10)
    assert denied.status_code == 401
    assert set(denied.json()["error"]) >= {"message", "type", "param", "code"}
    r = httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    lines = [line for line in r.text.splitlines() if line.startswith("mlxcore_requests_total")]
    assert lines and sum(float(line.rsplit(" ", 1)[1]) for line in lines) >= 1


# -- concurrency ----------------------------------------------------------------------------

CONCURRENT_PROMPTS = [
    "Tell me a story",
    "Count from one to ten",
    "Describe the weather",
    "Explain gravity",
    "hi",
    "What is 2+2?",
    "Write a haiku about autumn leaves falling slowly",
    "Summarize the plot of a novel you like in one long sentence please",
]


def _run_together(server: Server, calls: list[Any]) -> list[Any]:
    """Run ``calls`` on threads released at the same moment; check that the engine
    really had several of them running at once (batched)."""
    barrier = threading.Barrier(len(calls))
    done = threading.Event()
    most_running = 0

    def go(call: Any) -> Any:
        barrier.wait()
        return call()

    def watch() -> None:
        nonlocal most_running
        while not done.is_set():
            most_running = max(most_running, int(server.health()["running"]))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(len(calls)) as pool:
            results = list(pool.map(go, calls))
    finally:
        done.set()
        watcher.join()
    assert most_running >= 2, "the requests never ran together"
    return results


def test_concurrent_greedy_requests_equal_solo(client: openai.OpenAI, qwen_server: Server) -> None:
    def call(prompt: str) -> Any:
        return lambda: greedy_chat(client, prompt, max_tokens=16)

    solo = [call(p)() for p in CONCURRENT_PROMPTS]
    together = _run_together(qwen_server, [call(p) for p in CONCURRENT_PROMPTS])
    for prompt, alone, batched in zip(CONCURRENT_PROMPTS, solo, together, strict=True):
        assert batched.choices[0].message.content == alone.choices[0].message.content, prompt
        assert batched.usage.completion_tokens == alone.usage.completion_tokens


def test_concurrent_seeded_requests_equal_solo(client: openai.OpenAI, qwen_server: Server) -> None:
    def call(i: int) -> Any:
        return lambda: client.chat.completions.create(
            model=MODEL,
            messages=user(CONCURRENT_PROMPTS[i]),
            temperature=1.0,
            seed=100 + i,
            max_tokens=12,
        )

    solo = [call(i)() for i in range(4)]
    together = _run_together(qwen_server, [call(i) for i in range(4)])
    for alone, batched in zip(solo, together, strict=True):
        assert batched.choices[0].message.content == alone.choices[0].message.content
