"""KV events against the real vllm-router: two replicas publish their prefix caches
(``--kv-events-endpoint``), ``vllm-router --policy kv_aware`` reads them, and a
conversation's turns go to the replica holding its history. The longer replica suite
(agent sessions, kill -9, overload) is ``make replicas-e2e`` (tests/e2e/test_replicas.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import zmq

from mlxcore.testing.replicas import (
    TOOLS,
    Replica,
    Router,
    run_sessions,
    running,
    shared_system_prompt,
)
from mlxcore_kv_events.blocks import block_hash
from mlxcore_kv_events.publisher import decode

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def replicas(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Replica]]:
    logs = tmp_path_factory.mktemp("replicas")
    pair = [Replica(f"r{i}", tiny_qwen3, logs) for i in (1, 2)]
    with running(pair):
        yield pair


def test_a_conversation_follows_its_cache_through_the_router(
    replicas: list[Replica], tiny_qwen3: Path, tmp_path: Path
) -> None:
    router = Router("kv_aware", replicas, tiny_qwen3, tmp_path)
    router.start()
    try:
        turns = run_sessions(
            router.url, f"{replicas[0].url}/tokenize", sessions=2, turns=4,
            system=shared_system_prompt(600, salt="kv-events "), tools=False,
        )  # fmt: skip
    finally:
        router.stop()
    assert all(t.status == 200 for t in turns), [t.error for t in turns]
    for session in (0, 1):
        mine = [t for t in turns if t.session == session]
        # every turn where its history is (named by the x-mlxcore-replica header)
        assert len({t.replica for t in mine}) == 1 and mine[0].replica in ("r1", "r2"), mine
        assert all(t.cached_share >= 0.9 for t in mine[1:]), mine
    for replica in replicas:  # the fields the router adds to every request pass quietly
        log = next(replica.logs.glob(f"{replica.name}-*.log")).read_text()
        assert "skip_special_tokens" not in log and "not known" not in log, log[-2000:]


def test_a_request_with_tools_goes_where_its_prefix_is(
    replicas: list[Replica], tiny_qwen3: Path, tmp_path: Path
) -> None:
    """vllm-router cannot render a request with tools itself: it asks each replica's
    ``/v1/chat/completions/render`` for the ids, then scores the replicas by their
    events. A conversation held by the replica the router would not pick for a prompt
    nobody holds still gets its next turn there."""
    router = Router("kv_aware", replicas, tiny_qwen3, tmp_path)
    router.start()
    try:
        with httpx.Client(timeout=120) as client:

            def chat(base: str, messages: list[dict[str, str]]) -> httpx.Response:
                body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 4}
                answer = client.post(f"{base}/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                return answer

            fresh = [{"role": "user", "content": shared_system_prompt(200, salt="nobody ")}]
            chosen = chat(router.url, fresh).headers["x-mlxcore-replica"]
            holder = next(r for r in replicas if r.name != chosen)
            history = [
                {"role": "system", "content": shared_system_prompt(400, salt="tools turn ")},
                {"role": "user", "content": "Which rule mentions item 3?"},
            ]
            answer = chat(holder.url, history).json()["choices"][0]["message"]
            history += [
                {"role": "assistant", "content": answer.get("content") or ""},
                {"role": "user", "content": "And item 4?"},
            ]
            time.sleep(0.5)  # the holder's events reach the router
            turn = chat(router.url, history)
    finally:
        router.stop()
    assert turn.headers["x-mlxcore-replica"] == holder.name
    assert turn.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 1000


def test_a_new_subscriber_gets_a_clear_then_every_block_held(replicas: list[Replica]) -> None:
    replica = replicas[0]
    text = "A question that fills a few blocks of sixteen tokens. " * 8
    r = httpx.post(
        f"{replica.url}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 200
    prompt = httpx.post(
        f"{replica.url}/tokenize",
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
        timeout=30,
    ).json()["tokens"]
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(replica.events_address)
    events: list[dict[str, object]] = []
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _holds(events, prompt):
            if socket.poll(200):
                frames = socket.recv_multipart()
                assert frames[0] == b"" and len(frames[1]) == 8
                _, _, batch, rank = decode(frames)
                assert rank is None
                events.extend(batch)
    finally:
        socket.close(linger=0)
    assert events and events[0] == {"type": "AllBlocksCleared"}
    assert _holds(events, prompt), "the held prompt's blocks were not re-sent"
    stored = [e for e in events if e["type"] == "BlockStored"]
    for event in stored:
        hashes, tokens = event["block_hashes"], event["token_ids"]
        assert isinstance(hashes, list) and isinstance(tokens, list)
        assert event["block_size"] == 16 and len(tokens) == 16 * len(hashes)
        assert event["medium"] == "GPU"


def _holds(events: list[dict[str, object]], prompt: list[int]) -> bool:
    """Whether the stored events hold every complete block of ``prompt``, chained."""
    stored = {
        digest: event["parent_block_hash"]
        for event in events
        if event.get("type") == "BlockStored"
        for digest in event["block_hashes"]  # type: ignore[attr-defined]
    }
    parent = None
    for start in range(0, len(prompt) // 16 * 16, 16):
        digest = block_hash(parent, np.array(prompt[start : start + 16]))
        if digest not in stored:
            return False
        parent = digest
    return parent is not None
