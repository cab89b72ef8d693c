"""OpenAI's Files and Batch APIs through the official openai client against a real server:
a batch's outputs equal direct greedy requests, every endpoint kind and a failing line,
invalid input files, cancelling, and ``kill -9`` mid-batch then a restart on the same
folder: the batch completes with every ``custom_id`` exactly once. The runner runs
through the core's ``mlxcore_server_lifespan`` hook (started and stopped with the
server)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def start(factory: ServerFactory, model: Path, folder: Path, *flags: str) -> Server:
    return factory(
        model,
        "--served-model-name",
        "tiny",
        "--plugin",
        "batch",
        "--batch-dir",
        str(folder),
        *flags,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batches")


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, tiny_qwen3: Path, folder: Path) -> Server:
    return start(mlxcore_server, tiny_qwen3, folder)


def client_of(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


def chat_line(i: int, tokens: int = 8) -> dict[str, Any]:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"Tell me about number {i}"}],
            "max_tokens": tokens,
            "temperature": 0,
        },
    }


def upload(client: openai.OpenAI, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def wait(client: openai.OpenAI, batch_id: str, seconds: float = 300) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {batch.status}: {batch.request_counts}")


def results(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_of_chats_equals_direct_greedy_requests(server: Server) -> None:
    client = client_of(server)
    count = 1000
    lines = [chat_line(i) for i in range(count)]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "test"},
    )
    assert batch.status == "validating" and batch.metadata == {"run": "test"}
    done = wait(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed) == (count, count)
    assert done.request_counts.failed == 0 and done.error_file_id is None
    out = results(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in out) == sorted(line["custom_id"] for line in lines)
    by_id = {r["custom_id"]: r["response"] for r in out}
    for i in range(0, count, max(1, count // 10)):  # what the same request gives directly
        direct = client.chat.completions.create(**lines[i]["body"])
        answer = by_id[f"req-{i}"]
        assert answer["status_code"] == 200 and answer["request_id"]
        assert (
            answer["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
        )


def test_every_endpoint_and_a_failing_line(server: Server) -> None:
    client = client_of(server)
    for url, body in [
        ("/v1/completions", {"model": "tiny", "prompt": "Once", "max_tokens": 4}),
        ("/v1/embeddings", {"model": "tiny", "input": ["a", "b"]}),
        ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 4}),
    ]:
        lines = [
            {"custom_id": f"{url}-{i}", "method": "POST", "url": url, "body": body}
            for i in range(3)
        ]
        lines.append({**lines[0], "custom_id": "bad", "body": {**body, "model": "nope"}})
        done = wait(
            client,
            client.batches.create(
                input_file_id=upload(client, lines), endpoint=url, completion_window="24h"
            ).id,  # type: ignore[arg-type]
        )
        assert done.status == "completed", (url, done)
        assert (done.request_counts.completed, done.request_counts.failed) == (3, 1), url
        ok = results(client, done.output_file_id)
        assert {r["custom_id"] for r in ok} == {f"{url}-{i}" for i in range(3)}
        assert all(r["response"]["status_code"] == 200 for r in ok)
        (bad,) = results(client, done.error_file_id)
        assert bad["custom_id"] == "bad" and bad["response"]["status_code"] == 404
        assert bad["response"]["body"]["error"]["code"] == "model_not_found"
        if url == "/v1/embeddings":
            assert len(ok[0]["response"]["body"]["data"]) == 2


def test_invalid_input_files_fail_the_batch(server: Server) -> None:
    client = client_of(server)
    lines = [chat_line(0), chat_line(0), {**chat_line(2), "url": "/v1/embeddings"}]
    data = "".join(json.dumps(line) + "\n" for line in lines) + "not json\n"
    file_id = client.files.create(file=("bad.jsonl", data.encode()), purpose="batch").id
    done = wait(
        client,
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id,
    )
    assert done.status == "failed"
    codes = [(e.line, e.code) for e in done.errors.data]
    assert codes == [(2, "duplicate_custom_id"), (3, "invalid_url"), (4, "invalid_json_line")]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/nowhere",
            completion_window="24h",  # type: ignore[arg-type]
        )


def test_files_routes(server: Server) -> None:
    client = client_of(server)
    file_id = upload(client, [chat_line(1)])
    got = client.files.retrieve(file_id)
    assert got.purpose == "batch" and got.bytes > 0 and got.filename == "input.jsonl"
    assert file_id in [f.id for f in client.files.list(purpose="batch")]
    assert json.loads(client.files.content(file_id).text) == chat_line(1)
    assert client.files.delete(file_id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    # the upload's form is in the OpenAPI document and its HTML page
    import httpx

    spec = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    form = spec["paths"]["/v1/files"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert form["schema"]["required"] == ["file", "purpose"]
    assert form["schema"]["properties"]["purpose"]["enum"] == ["batch", "user_data"]
    page = httpx.get(f"{server.base_url}/docs", timeout=30)
    assert page.status_code == 200 and "multipart/form-data" in page.text


def test_cancel_stops_new_lines(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, tmp_path: Path
) -> None:
    server = start(mlxcore_server, tiny_qwen3, tmp_path, "--batch-concurrency", "2")
    client = client_of(server)
    lines = [chat_line(i, tokens=64) for i in range(100)]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    while client.batches.retrieve(batch.id).request_counts.completed < 2:
        time.sleep(0.1)
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    out = results(client, done.output_file_id)
    assert 2 <= len(out) < 100 and done.request_counts.completed == len(out)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_kill_9_mid_batch_then_restart_completes_each_line_once(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, tmp_path: Path
) -> None:
    first = start(mlxcore_server, tiny_qwen3, tmp_path, "--batch-concurrency", "4")
    client = client_of(first)
    count = 120
    batch = client.batches.create(
        input_file_id=upload(client, [chat_line(i, tokens=24) for i in range(count)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 20:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.proc.kill()  # SIGKILL: no clean-up of any kind
    first.proc.wait(timeout=30)
    second = start(mlxcore_server, tiny_qwen3, tmp_path, "--batch-concurrency", "4")
    client = client_of(second)
    done = wait(client, batch.id)
    assert done.status == "completed"
    out = results(client, done.output_file_id)
    ids = [r["custom_id"] for r in out]
    assert len(ids) == count and sorted(ids) == sorted(f"req-{i}" for i in range(count))
    assert done.request_counts.completed == count and done.request_counts.failed == 0


def test_bad_input_gets_clear_errors(server: Server) -> None:
    import httpx

    base = server.v1
    cases: list[tuple[str, str, dict[str, Any], int, str | None]] = [
        ("POST", "/files", {"json": {"purpose": "batch"}}, 415, None),
        (
            "POST",
            "/files",
            {"data": {"purpose": "batch"}, "files": {"x": ("a", b"1")}},
            400,
            "file",
        ),
        (
            "POST",
            "/files",
            {"data": {"purpose": "nope"}, "files": {"file": ("a", b"1")}},
            400,
            "purpose",
        ),
        (
            "POST",
            "/batches",
            {"content": b"{", "headers": {"content-type": "application/json"}},
            400,
            None,
        ),
        (
            "POST",
            "/batches",
            {"content": b"x", "headers": {"content-type": "text/plain"}},
            415,
            None,
        ),
        ("POST", "/batches", {"json": {"endpoint": "/v1/completions"}}, 400, "input_file_id"),
        (
            "POST",
            "/batches",
            {"json": {"input_file_id": "f", "endpoint": "/v1/nope"}},
            400,
            "endpoint",
        ),
        (
            "POST",
            "/batches",
            {
                "json": {
                    "input_file_id": "f",
                    "endpoint": "/v1/completions",
                    "completion_window": "1h",
                }
            },
            400,
            "completion_window",
        ),
        (
            "POST",
            "/batches",
            {"json": {"input_file_id": "f", "endpoint": "/v1/completions", "extra": 1}},
            400,
            None,
        ),
        ("GET", "/files?limit=0", {}, 400, "limit"),
        ("GET", "/batches?limit=abc", {}, 400, "limit"),
        ("GET", "/batches/batch_nope", {}, 404, "batch_id"),
        ("POST", "/batches/batch_nope/cancel", {}, 404, "batch_id"),
        ("GET", "/files/file-nope/content", {}, 404, "file_id"),
        ("DELETE", "/files/file-nope", {}, 404, "file_id"),
    ]
    for method, path, kwargs, status, param in cases:
        answer = httpx.request(method, base + path, timeout=30, **kwargs)
        assert answer.status_code == status, (path, kwargs, answer.text)
        error = answer.json()["error"]
        assert error["message"], path
        if param is not None:
            assert error["param"] == param, (path, error)
    assert server.alive()


def test_many_uploads_and_batches_at_once(server: Server) -> None:
    import concurrent.futures

    client = client_of(server)

    def one(i: int) -> str:
        file_id = upload(client, [chat_line(i, tokens=2)])
        return client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        ids = list(pool.map(one, range(64)))
    assert len(set(ids)) == 64
    for batch_id in ids:
        done = wait(client, batch_id)
        assert done.status == "completed" and done.request_counts.completed == 1


KEYS = """
[keys.alice]
key = "sk-alice"

[keys.bob]
key = "sk-bob"
"""


def test_each_key_sees_only_its_own_files_and_batches(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)
    server = start(mlxcore_server, tiny_qwen3, tmp_path / "batches", "--api-keys-file", str(keys))

    def as_key(secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=server.v1, api_key=secret, max_retries=0, timeout=60)

    alice, bob = as_key("sk-alice"), as_key("sk-bob")
    source = upload(alice, [chat_line(i, tokens=4) for i in range(3)])
    batch = alice.batches.create(
        input_file_id=source, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait(alice, batch.id)
    assert done.status == "completed" and len(results(alice, done.output_file_id)) == 3
    # Bob cannot see, read, delete or use any of it: each id is a 404, lists are empty.
    for call in (
        lambda: bob.files.retrieve(source),
        lambda: bob.files.content(source),
        lambda: bob.files.retrieve(done.output_file_id),
        lambda: bob.files.content(done.output_file_id),
        lambda: bob.files.delete(source),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.batches.create(
            input_file_id=source, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert bob.files.list().data == [] and bob.batches.list().data == []
    # Alice still has all of it, the batch's output file included.
    mine = {f.id for f in alice.files.list().data}
    assert {source, done.output_file_id} <= mine
    assert [b.id for b in alice.batches.list().data] == [batch.id]
    assert alice.files.delete(source).deleted
    # Bob's own upload is his alone.
    his = upload(bob, [chat_line(9)])
    assert [f.id for f in bob.files.list().data] == [his]
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(his)


def test_a_database_from_before_owners_keeps_its_records(tmp_path: Path) -> None:
    import sqlite3

    from mlxcore_batch.store import EVERYONE, Store

    old = sqlite3.connect(tmp_path / "batches.sqlite3")
    old.executescript(
        "CREATE TABLE files (id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL,"
        " bytes INTEGER NOT NULL, created_at INTEGER NOT NULL);"
        "CREATE TABLE batches (id TEXT PRIMARY KEY, body TEXT NOT NULL,"
        " created_at INTEGER NOT NULL);"
        "INSERT INTO files VALUES ('file-old', 'in.jsonl', 'batch', 3, 1);"
    )
    body = json.dumps({"id": "batch_old", "status": "completed"})
    old.execute("INSERT INTO batches VALUES ('batch_old', ?, 1)", (body,))
    old.commit()
    old.close()
    store = Store(tmp_path)
    # what was there belongs to no key: a server without keys still sees it, a key does not
    assert store.file("file-old", None) is not None and store.file("file-old", "alice") is None
    assert store.batch("batch_old", None) is not None and store.batch("batch_old", "alice") is None
    assert store.batch("batch_old", EVERYONE) is not None and store.owner_of("batch_old") is None
    store.close()


def test_lines_wait_for_idle_capacity_and_are_sent_again_when_turned_away(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, tmp_path: Path
) -> None:
    """While chats keep coming, batch lines do not start (background work waits for the
    grace after the last one); past --max-queue-wait the engine turns them away (503) and
    the runner sends them again: the batch completes, no line failed."""
    server = start(
        mlxcore_server, tiny_qwen3, tmp_path,
        "--max-queue-wait", "1", "--background-grace", "3", "--batch-concurrency", "3",
    )  # fmt: skip
    client = client_of(server)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    client.chat.completions.create(**chat)  # type: ignore[call-overload]
    batch = client.batches.create(
        input_file_id=upload(client, [chat_line(i) for i in range(6)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    busy_until = time.monotonic() + 4
    while time.monotonic() < busy_until:  # interactive traffic, back to back
        client.chat.completions.create(**chat)  # type: ignore[call-overload]
        assert client.batches.retrieve(batch.id).request_counts.completed == 0
    done = wait(client, batch.id, 120)
    assert done.status == "completed"
    assert done.request_counts.completed == 6 and done.request_counts.failed == 0
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    expired = [
        line for line in metrics.splitlines() if "expired_in_queue" in line and line[0] != "#"
    ]
    assert expired and float(expired[0].split()[-1]) >= 1  # some were turned away
