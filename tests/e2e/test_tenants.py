"""One server shared by several API keys (docs/security.md), over real HTTP with the
official clients: every route with an id in the OpenAPI document answers another key's
id with the very 404 of an unknown id; every administrative route answers an ordinary
key 403; the prefix cache is not shared across keys (unless they share a cache group)
nor across ``cache_salt`` values, in memory and on disk, across a restart; a key's
stored responses, files and running requests are bounded by its own limits; a key
removed from the keys file is refused within a second of SIGHUP while the others'
requests run on and the cache stays."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEYS = """
[keys.alice]
key = "sk-alice"

[keys.bob]
key = "sk-bob"

[keys.carol]
key = "sk-carol"
cache_group = "team"

[keys.dave]
key = "sk-dave"
cache_group = "team"

[keys.tight]
key = "sk-tight"
max_concurrent = 1
max_stored_bytes = "6KB"
max_file_bytes = 2000

[keys.root]
key = "sk-root"
role = "admin"
"""

PROMPT = "Summarise these notes. " + " ".join(f"note{i} is fine" for i in range(262))
"""About 1,500 tokens."""

ADMIN_ROUTES = {
    ("post", "/v1/models/{model_id}/load"),
    ("post", "/v1/models/{model_id}/unload"),
    ("post", "/v1/models/{model_id}/pin"),
    ("post", "/v1/models/{model_id}/unpin"),
    ("post", "/v1/models/{owner}/{model_id}/load"),
    ("post", "/v1/models/{owner}/{model_id}/unload"),
    ("post", "/v1/models/{owner}/{model_id}/pin"),
    ("post", "/v1/models/{owner}/{model_id}/unpin"),
    ("post", "/v1/load_lora_adapter"),
    ("post", "/v1/unload_lora_adapter"),
    ("post", "/api/pull"),
    ("delete", "/api/delete"),
    ("post", "/admin/reload-keys"),
}
"""What changes what the server holds for everyone: an admin key's only."""

SHARED_ID_ROUTES = {
    ("get", "/v1/models/{model_id}"),
    ("get", "/v1/models/{owner}/{model_id}"),
}
"""Routes with an id that name no stored record: the served models, the same for all."""


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tenants") / "keys.toml"
    path.write_text(KEYS)
    return path


def flags(keys: Path, disk: Path) -> tuple[str, ...]:
    return ("--served-model-name", "tiny", "--api-keys-file", str(keys), "--log-level", "info",
            "--plugin", "batch", "--batch-dir", str(disk / "batches"),
            "--plugin", "lora", "--allow-runtime-lora",
            "--plugin", "anthropic", "--plugin", "ollama",
            "--plugin", "disk-cache", "--disk-cache-dir", str(disk / "kv"),
            "--disk-cache-min-tokens", "64")  # fmt: skip


@pytest.fixture(scope="module")
def server(
    mlxcore_server: ServerFactory,
    tiny_qwen3: Path,
    keys_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    return mlxcore_server(tiny_qwen3, *flags(keys_file, tmp_path_factory.mktemp("disk")))


def chat(server: Server, key: str, content: str = PROMPT, **extra: Any) -> tuple[int, int]:
    """``(prompt_tokens, cached_tokens)`` of a greedy chat request."""
    client = openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": content}],
        max_tokens=2,
        temperature=0,
        extra_body=extra or None,
    )
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


def store_response(server: Server, key: str, text: str = "hello", **extra: Any) -> str:
    client = openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=60)
    return client.responses.create(
        model="tiny", input=text, max_output_tokens=3, extra_body=extra or None
    ).id


def upload(server: Server, key: str, lines: list[dict[str, Any]]) -> str:
    client = openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=60)
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id


def batch_line(i: int, content: str = "Hi") -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 2, "temperature": 0}  # fmt: skip
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def batch_body(file_id: str) -> dict[str, str]:
    return {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"}  # fmt: skip


def wait_batch(server: Server, key: str, batch_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        batch: dict[str, Any] = httpx.get(
            f"{server.v1}/batches/{batch_id}", headers=auth(key), timeout=30
        ).json()
        if batch["status"] in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} did not finish")


def _filled(path: str, ids: dict[str, str]) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), "tiny"), path)


def _without(text: str, *ids: str) -> str:
    for value in ids:
        text = text.replace(value, "<ID>")
    return text


def test_every_route_with_an_id_hides_another_keys_records(server: Server) -> None:
    """From the OpenAPI document: each route with an id parameter, called by bob with
    alice's id, answers exactly what it answers for an id nobody has (a 404)."""
    response_id = store_response(server, "sk-alice")
    file_id = upload(server, "sk-alice", [batch_line(0)])
    batch = httpx.post(
        f"{server.v1}/batches",
        headers=auth("sk-alice"),
        json={
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        timeout=30,
    ).json()
    mine = {"response_id": response_id, "file_id": file_id, "batch_id": batch["id"]}
    unknown = {"response_id": "resp_0123456789abcdef", "file_id": "file-0123456789abcdef",
               "batch_id": "batch_0123456789abcdef"}  # fmt: skip
    document = httpx.get(f"{server.base_url}/openapi.json", headers=auth("sk-bob")).json()
    checked = set()
    for path, operations in document["paths"].items():
        if "{" not in path:
            continue
        for method, operation in operations.items():
            if (method, path) in SHARED_ID_ROUTES or operation.get("x-mlxcore-admin"):
                continue
            names = set(re.findall(r"\{(\w+)\}", path))
            assert names <= set(mine), f"{method.upper()} {path}: an id of a new store?"
            checked.add((method, path))
            if method == "get":  # the owner finds it (nothing is changed for her)
                owner = httpx.get(server.base_url + _filled(path, mine),
                                  headers=auth("sk-alice"), timeout=60)  # fmt: skip
                assert owner.status_code == 200, (path, owner.text)
            theirs = httpx.request(method, server.base_url + _filled(path, mine),
                                   headers=auth("sk-bob"), timeout=60)  # fmt: skip
            nobodys = httpx.request(method, server.base_url + _filled(path, unknown),
                                    headers=auth("sk-bob"), timeout=60)  # fmt: skip
            assert theirs.status_code == nobodys.status_code == 404, (method, path)
            assert _without(theirs.text, *mine.values()) == _without(
                nobodys.text, *unknown.values()
            ), (method, path)
    assert {p for _, p in checked} >= {
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/input_items",
        "/v1/responses/{response_id}/cancel",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
        "/v1/batches/{batch_id}",
        "/v1/batches/{batch_id}/cancel",
    }
    # alice's conversation is hers: bob can neither continue nor list nor delete it
    bob = openai.OpenAI(base_url=server.v1, api_key="sk-bob", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="tiny", input="go on", previous_response_id=response_id)
    for listing in ("files", "batches"):
        found = httpx.get(f"{server.v1}/{listing}", headers=auth("sk-bob"), timeout=30).json()
        assert all(item["id"] not in mine.values() for item in found["data"])
    alice = openai.OpenAI(base_url=server.v1, api_key="sk-alice", max_retries=0, timeout=60)
    assert alice.responses.retrieve(response_id).id == response_id


def test_administrative_routes_need_an_admin_key(server: Server) -> None:
    document = httpx.get(f"{server.base_url}/openapi.json", headers=auth("sk-bob")).json()
    flagged = {
        (method, path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if operation.get("x-mlxcore-admin")
    }
    assert flagged == ADMIN_ROUTES
    for method, path in sorted(flagged):
        url = server.base_url + _filled(path, {"owner": "x"})
        refused = httpx.request(method, url, headers=auth("sk-bob"), json={}, timeout=30)
        assert refused.status_code == 403, (method, path, refused.text)
        error = refused.json()["error"]
        message = error if isinstance(error, str) else error["message"]
        assert "admin API key" in message
        if not path.startswith("/api/"):  # Ollama's errors are a string
            assert error["type"] == "permission_error" and error["code"] == "permission_denied"
    # an admin key may; the action is logged with the key's name, never its secret
    pinned = httpx.post(f"{server.v1}/models/tiny/pin", headers=auth("sk-root"), timeout=30)
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    httpx.post(f"{server.v1}/models/tiny/unpin", headers=auth("sk-root"), timeout=30)
    deadline = time.monotonic() + 5
    while "admin root: POST /v1/models/tiny/pin" not in server.log():
        assert time.monotonic() < deadline, server.log()[-2000:]
        time.sleep(0.1)
    assert "sk-root" not in server.log()
    me = httpx.get(f"{server.v1}/me", headers=auth("sk-carol"), timeout=10).json()
    assert me == {"object": "api_key", "name": "carol", "role": "user", "cache_group": "team",
                  "limits": dict.fromkeys(["requests_per_minute", "tokens_per_minute",
                                           "max_concurrent", "max_stored_bytes",
                                           "max_file_bytes"])}  # fmt: skip


def test_the_prefix_cache_is_not_shared_across_keys_groups_or_salts(server: Server) -> None:
    prompt, cached = chat(server, "sk-alice")
    assert 1400 <= prompt <= 1600 and cached < 8  # at most the template's opening, hers
    assert chat(server, "sk-alice")[1] >= prompt - 1  # her own prompt: cached
    assert chat(server, "sk-bob")[1] == 0  # the same prompt from another key: cold (his first)
    assert chat(server, "sk-bob")[1] >= prompt - 1
    # a salt partitions one key's cache further; the same salt shares
    assert chat(server, "sk-alice", cache_salt="s1")[1] == 0
    assert chat(server, "sk-alice", cache_salt="s1")[1] >= prompt - 1
    assert chat(server, "sk-alice", cache_salt="s2")[1] == 0
    assert chat(server, "sk-bob", cache_salt="s1")[1] == 0  # bob's s1 is not alice's
    # two keys of one cache group share
    assert chat(server, "sk-carol")[1] == 0
    assert chat(server, "sk-dave")[1] >= prompt - 1
    # every front end takes the salt (and a bad one is a 400 in its own shape)
    other = PROMPT.replace("notes", "remarks")
    responses = openai.OpenAI(base_url=server.v1, api_key="sk-bob", max_retries=0, timeout=120)
    for turn in range(2):  # a fresh salt: nothing, then its own prefix
        salted = responses.responses.create(
            model="tiny", input=other, max_output_tokens=2, extra_body={"cache_salt": "x"}
        )
        assert salted.usage is not None
        assert (salted.usage.input_tokens_details.cached_tokens > 1000) == (turn == 1)
    messages = anthropic.Anthropic(base_url=server.base_url, api_key="sk-bob", max_retries=0)
    kwargs: Any = {"model": "tiny", "max_tokens": 2,
                   "messages": [{"role": "user", "content": other}]}  # fmt: skip
    assert (
        messages.messages.create(
            **kwargs, extra_body={"cache_salt": "y"}
        ).usage.cache_read_input_tokens
        == 0
    )
    again = messages.messages.create(**kwargs, extra_body={"cache_salt": "y"})
    assert (again.usage.cache_read_input_tokens or 0) > 0
    ollama = httpx.post(
        f"{server.base_url}/api/chat",
        headers=auth("sk-bob"),
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "cache_salt": "z",
            "options": {"num_predict": 2},
        },
        timeout=60,
    )
    assert ollama.status_code == 200, ollama.text
    with pytest.raises(openai.BadRequestError, match="cache_salt"):
        chat(server, "sk-alice", cache_salt="")
    with pytest.raises(anthropic.BadRequestError):
        messages.messages.create(**kwargs, extra_body={"cache_salt": "s" * 1000})
    # the dashboard's list of recent requests shows a key its own requests only
    recent = httpx.get(f"{server.base_url}/metrics/json", headers=auth("sk-carol")).json()
    assert recent["recent_requests"] and all(
        r["prompt_tokens"] == prompt for r in recent["recent_requests"]
    )
    everyone = httpx.get(f"{server.base_url}/metrics/json", headers=auth("sk-root")).json()
    assert len(everyone["recent_requests"]) > len(recent["recent_requests"])


def test_a_batch_runs_as_its_owner(server: Server) -> None:
    """The runner's in-process requests are the batch owner's: its cache, its files."""
    content = PROMPT.replace("notes", "items")
    prompt, _ = chat(server, "sk-alice", content)
    lines = [batch_line(0, content)]
    results = {}
    for key in ("sk-alice", "sk-bob"):
        file_id = upload(server, key, lines)
        created = httpx.post(
            f"{server.v1}/batches",
            headers=auth(key),
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            timeout=30,
        ).json()
        done = wait_batch(server, key, created["id"])
        assert done["status"] == "completed", done
        output = httpx.get(
            f"{server.v1}/files/{done['output_file_id']}/content", headers=auth(key), timeout=30
        )
        other = "sk-bob" if key == "sk-alice" else "sk-alice"
        assert httpx.get(f"{server.v1}/files/{done['output_file_id']}",
                         headers=auth(other), timeout=30).status_code == 404  # fmt: skip
        body = json.loads(output.text.splitlines()[0])["response"]["body"]
        results[key] = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert results["sk-alice"] >= prompt - 1  # alice's own prompt: her batch reuses it
    assert results["sk-bob"] < 16  # at most the opening his own requests share


def test_a_keys_own_limits_bound_what_it_holds(server: Server) -> None:
    # stored responses: over its cap, the key evicts its own oldest, never another's
    alice_id = store_response(server, "sk-alice", "keep me")
    ids = [store_response(server, "sk-tight", f"turn {i} " + "x" * 300) for i in range(12)]
    tight = openai.OpenAI(base_url=server.v1, api_key="sk-tight", max_retries=0, timeout=30)
    kept = []
    for rid in ids:
        with contextlib.suppress(openai.NotFoundError):
            kept.append(tight.responses.retrieve(rid).id)
    assert 0 < len(kept) < len(ids) and kept == ids[-len(kept) :]  # the newest stayed
    alice = openai.OpenAI(base_url=server.v1, api_key="sk-alice", max_retries=0, timeout=30)
    assert alice.responses.retrieve(alice_id).id == alice_id
    # files: past max_file_bytes an upload is refused, nothing half-written stays
    upload(server, "sk-tight", [batch_line(0)])
    with pytest.raises(openai.BadRequestError, match="max_file_bytes"):
        upload(server, "sk-tight", [batch_line(i, "y" * 200) for i in range(10)])
    # running requests: one at a time for this key, the second a 429 with Retry-After
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Count"}],
            "max_tokens": 1000, "stream": True, "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", f"{server.v1}/chat/completions", json=body,
                      headers=auth("sk-tight"), timeout=60) as first:  # fmt: skip
        lines = first.iter_lines()  # kept: a dropped iterator closes the stream
        next(lines)
        second = httpx.post(f"{server.v1}/chat/completions", json={**body, "stream": False},
                            headers=auth("sk-tight"), timeout=60)  # fmt: skip
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert "max_concurrent" in second.json()["error"]["message"]
        assert chat(server, "sk-bob", "Hi")[0] > 0  # another key is not held back
        first.close()  # the stream's client goes: its request is cancelled
    deadline = time.monotonic() + 10
    while True:  # the slot is free again once the cancelled request has ended
        try:
            assert chat(server, "sk-tight", "Hi")[0] > 0
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_removed_key_is_refused_after_sighup(server: Server, keys_file: Path) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Count"}],
            "max_tokens": 400, "stream": True, "ignore_eos": True}  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(4) as pool:

        def stream() -> int:
            with httpx.stream("POST", f"{server.v1}/chat/completions", json=body,
                              headers=auth("sk-alice"), timeout=120) as answer:  # fmt: skip
                lines = [line for line in answer.iter_lines() if line]
                assert lines[-1] == "data: [DONE]"
                return answer.status_code

        running = [pool.submit(stream) for _ in range(3)]
        time.sleep(1.0)
        keys_file.write_text(KEYS.replace('[keys.bob]\nkey = "sk-bob"\n', ""))
        try:
            before = server.health()["memory"]["prefix_cache_bytes"]
            server.proc.send_signal(signal.SIGHUP)
            sent = time.monotonic()
            while httpx.get(f"{server.v1}/models", headers=auth("sk-bob")).status_code != 401:
                assert time.monotonic() - sent < 1.0, "bob's key still works 1 s after SIGHUP"
                time.sleep(0.02)
            refused_after = time.monotonic() - sent
            after = server.health()["memory"]["prefix_cache_bytes"]
            assert not any(f.done() for f in running), "the streams ended before the check"
            assert after == before  # reading the keys again left the cache alone
            assert [f.result() for f in running] == [200] * 3  # nothing else failed
            print(f"bob refused {refused_after * 1000:.0f} ms after SIGHUP")
        finally:
            keys_file.write_text(KEYS)
            server.proc.send_signal(signal.SIGHUP)
    assert server.alive()
    deadline = time.monotonic() + 5
    while httpx.get(f"{server.v1}/models", headers=auth("sk-bob")).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # the admin route does the same; a bad file leaves the keys in force
    keys_file.write_text("not toml [")
    try:
        bad = httpx.post(f"{server.base_url}/admin/reload-keys", headers=auth("sk-root"))
        assert bad.status_code == 400 and "not TOML" in bad.json()["error"]["message"]
        assert chat(server, "sk-bob", "still here")[0] > 0
    finally:
        keys_file.write_text(KEYS)
    good = httpx.post(f"{server.base_url}/admin/reload-keys", headers=auth("sk-root")).json()
    assert good == {"object": "keys.reload", "keys": 6, "added": [], "removed": []}


@pytest.mark.long  # two more servers: `make test-long` (the memory tier's case runs above)
def test_partitions_hold_on_disk_and_across_a_restart(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, keys_file: Path, tmp_path: Path
) -> None:
    content = PROMPT.replace("notes", "files")
    first = mlxcore_server(tiny_qwen3, *flags(keys_file, tmp_path))
    prompt, cached = chat(first, "sk-alice", content)
    assert cached == 0
    assert chat(first, "sk-bob", content)[1] == 0
    first.stop()
    assert list((tmp_path / "kv").glob("*/*.safetensors")), "nothing was written to disk"
    second = mlxcore_server(tiny_qwen3, *flags(keys_file, tmp_path))
    client = openai.OpenAI(base_url=second.v1, api_key="sk-carol", max_retries=0, timeout=120)
    cold = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=2,
        extra_body={"explain_cache": True},
    )  # fmt: skip
    assert cold.usage is not None and cold.usage.prompt_tokens_details is not None
    assert cold.usage.prompt_tokens_details.cached_tokens == 0  # another key: nothing
    alice = openai.OpenAI(base_url=second.v1, api_key="sk-alice", max_retries=0, timeout=120)
    warm = alice.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": content}], max_tokens=2,
        extra_body={"explain_cache": True},
    )  # fmt: skip
    assert warm.usage is not None and warm.usage.prompt_tokens_details is not None
    assert warm.usage.prompt_tokens_details.cached_tokens >= prompt - 16
    assert (warm.usage.model_extra or {})["mlxcore"]["cache"]["source"] == "disk"
