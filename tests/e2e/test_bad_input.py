"""Hostile and broken input against a real ``mlxcore serve``, with raw ``httpx`` and sockets.

Every malformed request must get a 4xx with the OpenAI error shape
``{"error": {"message", "type", "param", "code"}}`` (``param`` naming the field where
there is one), never a 500; overload gives 503 with ``Retry-After``; hundreds of
concurrent connections and clients that hang up mid-request leave the server healthy.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.e2e

API_KEY = "test-key"  # as qwen_server in conftest.py
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "tiny-qwen3"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
REMOVE = object()
ANY_PARAM = object()


@pytest.fixture(scope="module")
def http(qwen_server: Server) -> Iterator[httpx.Client]:
    """A client on the shared server, with the API key."""
    with httpx.Client(base_url=qwen_server.base_url, headers=AUTH, timeout=60) as c:
        yield c


def chat_body(**overrides: Any) -> dict[str, Any]:
    """A small valid chat request with ``overrides`` (``REMOVE`` deletes a field)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not REMOVE}


def completion_body(**overrides: Any) -> dict[str, Any]:
    """A small valid text-completion request with ``overrides``."""
    body: dict[str, Any] = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not REMOVE}


def assert_error(
    r: httpx.Response, status: int | None = None, param: object = ANY_PARAM
) -> dict[str, Any]:
    """``r`` is a 4xx (``status`` if given) with the OpenAI error shape; returns the error.

    ``param`` is the field the error must name: equal, or a path inside it
    (``messages`` matches ``messages[0].role``).
    """
    assert r.status_code != 500, r.text
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if status is not None:
        assert r.status_code == status, r.text
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body, dict) and list(body) == ["error"], body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    if param is not ANY_PARAM:
        got = err["param"]
        if param is None:
            assert got is None, err
        else:
            assert isinstance(param, str) and isinstance(got, str), err
            assert got == param or re.match(rf"{re.escape(param)}[\[.]", got), err
    return dict(err)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 0.1 s; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def idle(server: Server) -> bool:
    """True when the engine has nothing running or waiting."""
    h = server.health()
    return h["running"] == 0 and h["waiting"] == 0


def metric(server: Server, name: str, **labels: str) -> float:
    """The value of one Prometheus sample (0 when absent)."""
    text = httpx.get(f"{server.base_url}/metrics", headers=AUTH, timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = f"{name}{{{want}}}" if want else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# -- malformed JSON fields --------------------------------------------------------------------

CHAT_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("messages-int", chat_body(messages=5), "messages"),
    ("messages-string", chat_body(messages="hi"), "messages"),
    ("temperature-string", chat_body(temperature="hot"), "temperature"),
    ("max_tokens-float", chat_body(max_tokens=2.5), "max_tokens"),
    ("stop-dict", chat_body(stop={"a": 1}), "stop"),
    ("stop-list-of-ints", chat_body(stop=[1, 2]), "stop"),
    ("missing-messages", chat_body(messages=REMOVE), "messages"),
    ("empty-messages", chat_body(messages=[]), "messages"),
    ("unknown-role", chat_body(messages=[{"role": "wizard", "content": "x"}]), "messages"),
    ("message-without-role", chat_body(messages=[{"content": "x"}]), "messages"),
    ("message-is-string", chat_body(messages=["hi"]), "messages"),
    ("content-int", chat_body(messages=[{"role": "user", "content": 5}]), "messages"),
    (
        "content-part-image",
        chat_body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
        "messages",
    ),
    ("model-int", chat_body(model=5), "model"),
    ("stream-string", chat_body(stream="yes"), "stream"),
    ("stream_options-int", chat_body(stream=True, stream_options=5), "stream_options"),
    ("tools-int", chat_body(tools=5), "tools"),
    ("tools-without-name", chat_body(tools=[{"type": "function", "function": {}}]), "tools"),
    ("tool_choice-unknown", chat_body(tool_choice="sometimes"), "tool_choice"),
    ("max_tokens-huge", chat_body(max_tokens=10**30), "max_tokens"),
    ("max_tokens-zero", chat_body(max_tokens=0), "max_tokens"),
    ("max_tokens-negative", chat_body(max_tokens=-5), "max_tokens"),
    (
        "max_completion_tokens-huge",
        chat_body(max_tokens=REMOVE, max_completion_tokens=10**30),
        "max_completion_tokens",
    ),
    ("seed-huge", chat_body(seed=10**40), "seed"),
    ("seed-huge-negative", chat_body(seed=-(10**40)), "seed"),
    ("temperature-1e308", chat_body(temperature=1e308), "temperature"),
    ("temperature-negative", chat_body(temperature=-1), "temperature"),
    ("top_p-huge", chat_body(top_p=1e300), "top_p"),
    ("presence_penalty-huge", chat_body(presence_penalty=1e30), "presence_penalty"),
    ("n-huge", chat_body(n=10**9), "n"),
    ("n-zero", chat_body(n=0), "n"),
    ("logit_bias-huge-token", chat_body(logit_bias={str(10**30): 5}), "logit_bias"),
    ("logit_bias-negative-token", chat_body(logit_bias={"-1": 5}), "logit_bias"),
    ("logit_bias-not-a-number-key", chat_body(logit_bias={"abc": 5}), "logit_bias"),
    ("logit_bias-huge-value", chat_body(logit_bias={"5": 1e300}), "logit_bias"),
    ("top_logprobs-huge", chat_body(logprobs=True, top_logprobs=10**20), "top_logprobs"),
    ("top_logprobs-without-logprobs", chat_body(top_logprobs=2), "top_logprobs"),
    (
        "response_format-json-schema",
        chat_body(response_format={"type": "json_schema"}),
        "response_format",
    ),
    ("too-many-stops", chat_body(stop=["x"] * 100), "stop"),
    # a client-supplied template runs on the server's event loop: a nested loop in it
    # stalls every other request (vLLM refuses these by default too)
    (
        "chat_template-from-the-client",
        chat_body(chat_template_kwargs={"chat_template": "{{ 'hi' }}"}),
        "chat_template_kwargs",
    ),
    ("chat_template_kwargs-tokenize", chat_body(chat_template_kwargs={"tokenize": True}), None),
]


@pytest.mark.parametrize(
    ("body", "param"), [c[1:] for c in CHAT_CASES], ids=[c[0] for c in CHAT_CASES]
)
def test_chat_bad_fields(http: httpx.Client, body: dict[str, Any], param: str | None) -> None:
    err = assert_error(http.post(CHAT, json=body), 400, ANY_PARAM if param is None else param)
    assert err["type"] == "invalid_request_error"


COMPLETION_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("missing-prompt", completion_body(prompt=REMOVE), "prompt"),
    ("prompt-int", completion_body(prompt=5), "prompt"),
    ("prompt-nested-too-deep", completion_body(prompt=[[1, 2], [[3]]]), "prompt[1]"),
    ("prompt-batch-id-outside-vocab", completion_body(prompt=[[1], [10**12]]), "prompt[1]"),
    ("prompt-ids-outside-vocab", completion_body(prompt=[10**12]), "prompt"),
    ("prompt-negative-id", completion_body(prompt=[-1]), "prompt"),
    ("prompt-empty-string", completion_body(prompt=""), "prompt"),
    ("prompt-empty-list", completion_body(prompt=[]), "prompt"),
    ("prompt-mixed-list", completion_body(prompt=["a", 1]), "prompt[1]"),
    ("prompt-too-many-strings", completion_body(prompt=["a"] * 129), "prompt"),
    ("prompt-strings-and-ids", completion_body(prompt=["a", [1]]), "prompt"),
    ("prompt-bools", completion_body(prompt=[True, False]), "prompt[0]"),
    ("logprobs-huge", completion_body(logprobs=10**10), "logprobs"),
    ("logprobs-negative", completion_body(logprobs=-1), "logprobs"),
    ("echo-string", completion_body(echo="yes"), "echo"),
    ("suffix", completion_body(suffix="x"), "suffix"),
    ("max_tokens-huge", completion_body(max_tokens=10**30), "max_tokens"),
    ("temperature-string", completion_body(temperature="hot"), "temperature"),
    ("n-huge", completion_body(n=10**9), "n"),
]


@pytest.mark.parametrize(
    ("body", "param"),
    [c[1:] for c in COMPLETION_CASES],
    ids=[c[0] for c in COMPLETION_CASES],
)
def test_completion_bad_fields(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    assert_error(http.post(COMPLETIONS, json=body), 400, param)


CONTEXT = 40960  # tiny_qwen3's max_position_embeddings; the server runs without --max-model-len


def test_prompt_beyond_the_model_context_is_400(http: httpx.Client) -> None:
    """Without --max-model-len the model's own context length (config.json) bounds a
    request: a prompt that fills it, or a prompt plus max_tokens beyond it, is refused."""
    long = "hi " * (CONTEXT + 2000)
    r = http.post(CHAT, json=chat_body(max_tokens=1, messages=[{"role": "user", "content": long}]))
    assert assert_error(r, 400, "messages")["code"] == "context_length_exceeded"
    r = http.post(COMPLETIONS, json=completion_body(max_tokens=1, prompt=long))
    assert assert_error(r, 400, "prompt")["code"] == "context_length_exceeded"
    # max_tokens that fits on its own but not after the prompt
    assert_error(http.post(CHAT, json=chat_body(max_tokens=CONTEXT - 3)), 400, "max_tokens")
    r = http.post(COMPLETIONS, json=completion_body(max_tokens=CONTEXT))  # prompt: 1 token
    assert_error(r, 400, "max_tokens")
    # the largest budget that fits is accepted (checked, not run: n > 16 fails after it)
    r = http.post(CHAT, json=chat_body(max_tokens=CONTEXT - 100, n=17))
    assert_error(r, 400, "n")


def test_mlxcore_generate_refuses_what_http_refuses_with_the_same_message(
    http: httpx.Client, tiny_qwen3: Path
) -> None:
    """``mlxcore generate`` builds its request with the server's request builder: a prompt
    beyond the context and a bad plugin option end with the 400's message (a good option
    is taken: tests/core/test_cli.py)."""
    long = "hi " * (CONTEXT + 2000)  # < 128 KiB: one command-line argument may hold it
    cases = [
        (chat_body(messages=[{"role": "user", "content": long}]), ["-p", long]),
        (chat_body(speculative="yes"), ["-p", "hi", "--request-options", '{"speculative": "yes"}']),
    ]
    for body, argv in cases:
        message = assert_error(http.post(CHAT, json=body), 400)["message"]
        out = subprocess.run(
            [sys.executable, "-m", "mlxcore", "generate", str(tiny_qwen3), *argv],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert f"mlxcore: error: {message}\n" in out.stderr


def test_a_huge_prompt_does_not_stall_other_requests(
    http: httpx.Client, qwen_server: Server
) -> None:
    """A ~2.6 MB prompt (0.6M tokens, ~3 s to tokenize) can never fit the context: it is
    refused from its size before it is templated or tokenized, so neither it nor the
    small requests sent beside it wait (issue: two such prompts held a tiny request
    up for 8 s on one shared preparation thread)."""
    big = "hello world, " * 200_000
    started = time.monotonic()
    body = chat_body(max_tokens=1, messages=[{"role": "user", "content": big}])
    results: list[httpx.Response] = []
    senders = [
        threading.Thread(target=lambda: results.append(http.post(CHAT, json=body)))
        for _ in range(2)
    ]
    for sender in senders:
        sender.start()
    small = http.post(CHAT, json=chat_body(max_tokens=1))
    small_took = time.monotonic() - started
    for sender in senders:
        sender.join()
    assert small.status_code == 200, small.text
    assert len(results) == 2
    for r in results:
        error = assert_error(r, 400, "messages")
        assert error["code"] == "context_length_exceeded"
        assert "characters" in error["message"]
    assert small_took < 5.0, f"a tiny request took {small_took:.1f}s beside two huge prompts"


def test_huge_top_k_is_not_a_server_error(http: httpx.Client) -> None:
    """A top_k beyond the vocabulary means "no top-k"; it must not crash the sampler."""
    for top_k in (10**20, 10**6):
        r = http.post(CHAT, json=chat_body(top_k=top_k, temperature=1.0, seed=1))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("temperature", [1e-6, 1e-40, 5e-324])
def test_a_vanishing_temperature_is_greedy(http: httpx.Client, temperature: float) -> None:
    """Below 1e-5 (vLLM's bound) a temperature is greedy decoding: 1/T past float32's range
    turned every logit to +-inf, sampled noise, and failed a grammar request with a 500."""
    ask = {"prompt": "Once", "max_tokens": 8}
    greedy = http.post(COMPLETIONS, json={**ask, "temperature": 0})
    tiny = http.post(COMPLETIONS, json={**ask, "temperature": temperature})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    body = {"prompt": "Once", "max_tokens": 8, "temperature": temperature, "guided_regex": "ò·x"}
    constrained = http.post(COMPLETIONS, json=body)
    assert constrained.status_code == 200, constrained.text
    assert constrained.json()["choices"][0]["text"] == "ò·x"


@pytest.mark.parametrize("field", ["guided_regex", "structured_outputs"])
def test_min_tokens_yields_to_a_complete_grammar(http: httpx.Client, field: str) -> None:
    """A grammar complete before ``min_tokens`` (the fuzz found it: a 500): min_tokens bans
    the end of sequence, the grammar allows nothing else; the grammar wins."""
    grammar: Any = "ò·" if field == "guided_regex" else {"regex": "ò·"}
    for temperature in (0.0, 1.0):
        body = {"prompt": "A", "max_tokens": 8, "min_tokens": 5, "temperature": temperature}
        r = http.post(COMPLETIONS, json={**body, field: grammar})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["text"] == "ò·" and choice["finish_reason"] == "stop"


# -- malformed bodies -----------------------------------------------------------------------

RAW_BODIES: list[tuple[str, bytes]] = [
    ("invalid-utf8", b'{"model":"tiny-qwen3","messages":[{"role":"user","content":"\xff\xfe"}]}'),
    ("invalid-utf8-key", b'{"\xc3\x28":1,"messages":[{"role":"user","content":"x"}]}'),
    ("not-json", b"hello there"),
    ("json-array", b'[{"role":"user","content":"hi"}]'),
    ("json-null", b"null"),
    ("json-number", b"42"),
    ("json-string", b'"hi"'),
    ("empty", b""),
    ("truncated", b'{"messages": [{"role": "user", "content": "hi"'),
    ("trailing-garbage", b'{"messages": [{"role": "user", "content": "hi"}]} xyz'),
    ("lone-surrogate", b'{"messages":[{"role":"user","content":"\\ud800"}]}'),
    ("nan-literal", b'{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}'),
    ("thousand-digit-number", b'{"messages":[],"max_tokens":' + b"9" * 5000 + b"}"),
    ("deep-nesting", b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("raw", [r[1] for r in RAW_BODIES], ids=[r[0] for r in RAW_BODIES])
def test_malformed_body(http: httpx.Client, path: str, raw: bytes) -> None:
    r = http.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert_error(r, 400)


def test_body_of_10_mb_is_413(http: httpx.Client) -> None:
    body = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * 10_000_000}]))
    r = http.post(CHAT, content=body, headers={"Content-Type": "application/json"})
    err = assert_error(r, 413)
    assert "large" in err["message"]


def test_chunked_body_over_the_limit_is_413(http: httpx.Client) -> None:
    """Without a Content-Length the limit is enforced on the bytes actually read."""

    def chunks() -> Iterator[bytes]:
        yield b'{"messages":[{"role":"user","content":"'
        for _ in range(10):
            yield b"x" * 1_000_000
        yield b'"}]}'

    r = http.post(CHAT, content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(r, 413)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_wrong_content_type_is_415(http: httpx.Client, content_type: str) -> None:
    body = json.dumps(chat_body()).encode()
    assert_error(http.post(CHAT, content=body, headers={"Content-Type": content_type}), 415)
    raw = json.dumps(completion_body()).encode()
    assert_error(http.post(COMPLETIONS, content=raw, headers={"Content-Type": content_type}), 415)


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", None])
def test_json_content_types_are_accepted(http: httpx.Client, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = http.post(CHAT, content=json.dumps(chat_body()).encode(), headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", CHAT), ("PUT", CHAT), ("GET", COMPLETIONS), ("DELETE", "/v1/models")],
)
def test_wrong_method_is_405(http: httpx.Client, method: str, path: str) -> None:
    r = http.request(method, path)
    assert_error(r, 405)
    assert "POST" in r.headers.get("allow", "") or "GET" in r.headers.get("allow", "")


@pytest.mark.parametrize("path", ["/v1/nope", "/v2/chat/completions", "/v1/chat/completions/x"])
def test_unknown_route_is_404(http: httpx.Client, path: str) -> None:
    assert_error(http.post(path, json=chat_body()), 404)
    assert_error(http.get(path), 404)


def assert_no_server_errors(server: Server) -> None:
    """The server runs and logged no unhandled error (each 500 logs one)."""
    assert server.alive(), server.log()
    log = server.log()
    assert "unhandled error" not in log, log
    assert "Traceback" not in log, log


def test_server_still_serves_after_bad_input(http: httpx.Client, qwen_server: Server) -> None:
    r = http.post(CHAT, json=chat_body(max_tokens=4))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert_no_server_errors(qwen_server)


# -- hang-ups ---------------------------------------------------------------------------------


def _raw_request(server: Server, body: dict[str, Any]) -> socket.socket:
    """Send a chat request on a raw socket and return the open socket."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(head + payload)
    return sock


@pytest.mark.parametrize(
    ("stream", "n"),
    [(True, 1), (False, 1), (True, 2), (False, 2)],
    ids=["stream", "non-stream", "stream-n2", "non-stream-n2"],
)
def test_client_disconnect_cancels_the_request(qwen_server: Server, stream: bool, n: int) -> None:
    wait_until(lambda: idle(qwen_server), 30, "an idle server")
    cancelled = metric(qwen_server, "mlxcore_requests_total", finish_reason="cancelled")
    # ~600 tokens take >10 s on this model: far longer than the 5 s allowed below.
    body = chat_body(max_tokens=600, temperature=0, stream=stream, n=n)
    sock = _raw_request(qwen_server, body)
    try:
        if stream:
            received = b""
            while received.count(b"data: ") < 3 * n:
                data = sock.recv(65536)
                assert data, "the server closed the stream early"
                received += data
            assert received.startswith(b"HTTP/1.1 200")
        else:
            wait_until(lambda: qwen_server.health()["running"] == n, 10, "the request to run")
    finally:
        sock.close()
    wait_until(lambda: idle(qwen_server), 5, "the abandoned request to be cancelled")
    after = metric(qwen_server, "mlxcore_requests_total", finish_reason="cancelled")
    assert after == cancelled + n
    assert_no_server_errors(qwen_server)


# -- many connections ---------------------------------------------------------------------------


def _garbage_request(i: int) -> tuple[str, str, dict[str, Any]]:
    """Request number ``i`` of the storm: method, path and httpx keyword arguments."""
    json_headers = {"Content-Type": "application/json"}
    kind = i % 10
    if kind in (0, 1):
        return "POST", CHAT, {"json": chat_body(max_tokens=2, temperature=0)}
    if kind == 2:
        return "POST", COMPLETIONS, {"json": completion_body(max_tokens=2)}
    if kind == 3:
        return "POST", CHAT, {"content": b"\x00\x01garbage{{{", "headers": json_headers}
    if kind == 4:
        return "POST", CHAT, {"content": b"[1, 2, 3]", "headers": json_headers}
    if kind == 5:
        return "POST", CHAT, {"json": chat_body(messages=7, temperature="x")}
    if kind == 6:
        return "POST", COMPLETIONS, {"content": b'{"prompt":"\xff"}', "headers": json_headers}
    if kind == 7:
        return "GET", CHAT, {}
    if kind == 8:
        return "POST", f"/v1/garbage/{i}", {"json": {"x": i}}
    return "POST", CHAT, {"json": chat_body(max_tokens=2, stream=True)}


async def _storm(server: Server, count: int) -> list[int]:
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(120, connect=60, pool=60)
    async with httpx.AsyncClient(
        base_url=server.base_url, headers=AUTH, limits=limits, timeout=timeout
    ) as client:
        start = asyncio.Event()

        async def one(i: int) -> int:
            method, path, kwargs = _garbage_request(i)
            await start.wait()
            r = await client.request(method, path, **kwargs)
            await r.aread()
            if 400 <= r.status_code < 500 and r.status_code != 429:
                assert_error(r)
            return r.status_code

        async def junk(i: int) -> None:
            """Not HTTP at all, or a request cut off halfway."""
            _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            await start.wait()
            if i % 2:
                writer.write(b"\x16\x03\x01 this is not http\r\n\r\n")
            else:
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        tasks = [asyncio.create_task(one(i)) for i in range(count)]
        junk_tasks = [asyncio.create_task(junk(i)) for i in range(20)]
        await asyncio.sleep(0.5)
        start.set()
        await asyncio.gather(*junk_tasks)
        return list(await asyncio.gather(*tasks))


def test_500_concurrent_connections(qwen_server: Server) -> None:
    statuses = asyncio.run(_storm(qwen_server, 500))
    bad = [s for s in statuses if not (200 <= s < 300 or 400 <= s < 500 or s == 503)]
    assert not bad, sorted(set(bad))
    valid = sum(1 for i in range(500) if i % 10 in (0, 1, 2, 9))
    assert statuses.count(200) == valid, "every valid request must be served"
    assert qwen_server.alive()
    wait_until(lambda: idle(qwen_server), 30, "the storm to drain")
    r = httpx.post(f"{qwen_server.base_url}{CHAT}", json=chat_body(), headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    assert_no_server_errors(qwen_server)


# -- a small server: body limit and overload ----------------------------------------------------

BODY_LIMIT = 4096


@pytest.fixture(scope="module")
def small_server(mlxcore_server: ServerFactory, tiny_qwen3: Path) -> Iterator[Server]:
    """One sequence at a time, two waiting, 4 KiB bodies; no API key."""
    flags = f"--served-model-name {MODEL} --max-num-seqs 1 --max-queue-size 2"
    server = mlxcore_server(tiny_qwen3, *flags.split(), "--max-request-body-bytes", str(BODY_LIMIT))
    yield server
    server.stop()


def test_body_over_the_configured_limit_is_413(small_server: Server) -> None:
    url = f"{small_server.base_url}{CHAT}"

    def sized(n: int) -> bytes:
        body = json.dumps(chat_body(max_tokens=1, messages=[{"role": "user", "content": ""}]))
        pad = n - len(body.encode())
        return json.dumps(
            chat_body(max_tokens=1, messages=[{"role": "user", "content": "a " * (pad // 2)}])
        ).encode()

    under, over = sized(BODY_LIMIT - 200), sized(BODY_LIMIT + 200)
    assert len(under) <= BODY_LIMIT < len(over)
    headers = {"Content-Type": "application/json"}
    assert httpx.post(url, content=under, headers=headers, timeout=60).status_code == 200
    assert_error(httpx.post(url, content=over, headers=headers, timeout=60), 413)


def test_overload_gives_503_with_retry_after(small_server: Server) -> None:
    url = f"{small_server.base_url}{CHAT}"
    count = 10
    clients = [httpx.Client(timeout=120) for _ in range(count)]
    barrier = threading.Barrier(count)
    results: list[httpx.Response | BaseException] = [ValueError("not run")] * count

    def fire(i: int) -> None:
        body = chat_body(max_tokens=60, temperature=0, stream=bool(i % 2))
        barrier.wait()
        try:
            results[i] = clients[i].post(url, json=body)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(count)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
    finally:
        for c in clients:
            c.close()
    responses = [r for r in results if isinstance(r, httpx.Response)]
    assert len(responses) == count, results
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    # one running and two waiting fit; the rest arrive while those are busy
    assert statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
    for r in responses:
        if r.status_code == 503:
            assert r.headers.get("retry-after", "").isdigit(), r.headers
            err = assert_error_5xx(r)
            assert err["type"] == "overloaded_error"
        else:
            assert r.text.rstrip().endswith("[DONE]") or r.json()["choices"][0]["finish_reason"]
    rejected = metric(small_server, "mlxcore_rejected_requests_total", reason="overloaded")
    assert rejected >= statuses.count(503)
    wait_until(lambda: idle(small_server), 60, "the accepted requests to finish")
    r = httpx.post(url, json=chat_body(max_tokens=3), timeout=60)
    assert r.status_code == 200, r.text
    assert_no_server_errors(small_server)


def test_abandoned_waiting_requests_free_the_queue(small_server: Server) -> None:
    wait_until(lambda: idle(small_server), 60, "an idle server")
    running = _raw_request(small_server, chat_body(max_tokens=300, stream=True))
    try:
        wait_until(lambda: small_server.health()["running"] == 1, 10, "the first request")
        waiting = [_raw_request(small_server, chat_body(max_tokens=300)) for _ in range(2)]
        wait_until(lambda: small_server.health()["waiting"] == 2, 10, "two waiting requests")
        for sock in waiting:
            sock.close()
        wait_until(lambda: small_server.health()["waiting"] == 0, 3, "the queue to empty")
    finally:
        running.close()
        wait_until(lambda: idle(small_server), 60, "an idle server")


def assert_error_5xx(r: httpx.Response) -> dict[str, Any]:
    """A 503 with the OpenAI error shape."""
    assert r.status_code == 503
    body = r.json()
    assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_more_choices_than_the_queue_holds_is_400(small_server: Server) -> None:
    url = f"{small_server.base_url}{CHAT}"
    r = httpx.post(url, json=chat_body(max_tokens=2, n=3), timeout=60)
    err = assert_error(r, 400)
    assert err["param"] == "n" and "--max-queue-size" in err["message"]
    # n within the queue still works on the same server
    ok = httpx.post(url, json=chat_body(max_tokens=2, n=2), timeout=60)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2


def test_head_health_is_200_without_a_body(small_server: Server) -> None:
    r = httpx.head(f"{small_server.base_url}/health", timeout=30)
    assert r.status_code == 200 and r.content == b""


def test_made_up_http_methods_share_one_metrics_label(http: httpx.Client) -> None:
    """A label per method a client makes up would grow /metrics without bound."""
    for i in range(20):
        http.request(f"MADEUP{i}", "/v1/models")
    text = http.get("/metrics").text
    assert "MADEUP" not in text
    assert 'method="other"' in text
