"""Priorities through a real server: a request's ``priority`` (vLLM's field, sent by the
official openai client) overtakes a queue of a low-priority key's requests, and that key
cannot jump the queue by asking for a better priority."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = [pytest.mark.e2e]

KEYS = """
[keys.batch]
key = "sk-batch"
priority = "low"

[keys.app]
key = "sk-app"
"""


@pytest.fixture(scope="module")
def server(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory
) -> Server:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(KEYS)
    return mlxcore_server(
        tiny_qwen3,
        "--served-model-name",
        "tiny",
        "--max-num-seqs",
        "1",
        "--priority-aging",
        "0",
        "--api-keys-file",
        str(keys),
    )


def test_priority_overtakes_a_low_priority_queue(server: Server) -> None:
    finished: list[str] = []
    lock = threading.Lock()

    def chat(name: str, key: str, tokens: int, priority: int | None = None) -> None:
        client = openai.OpenAI(base_url=server.v1, api_key=key, max_retries=0, timeout=120)
        extra = {"ignore_eos": True} | ({"priority": priority} if priority is not None else {})
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": name}],
            max_tokens=tokens,
            temperature=0,
            extra_body=extra,
        )
        with lock:
            finished.append(name)

    def waiting() -> int:
        return int(httpx.get(f"{server.base_url}/health", timeout=10).json()["waiting"])

    threads = [threading.Thread(target=chat, args=("first", "sk-app", 600))]
    threads[0].start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.base_url}/health").json()["running"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    for i, asked in enumerate((None, None, -5)):  # the last asks to jump: held at "low"
        threads.append(threading.Thread(target=chat, args=(f"batch{i}", "sk-batch", 4, asked)))
        threads[-1].start()
    while waiting() < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    threads.append(threading.Thread(target=chat, args=("urgent", "sk-app", 4, -1)))
    threads[-1].start()
    while waiting() < 4:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    threads.append(threading.Thread(target=chat, args=("plain", "sk-app", 4)))
    threads[-1].start()
    for t in threads:
        t.join(timeout=120)
    assert finished[0] == "first"
    assert finished[1:3] == ["urgent", "plain"]  # priority -1, then 0, then the low key's
    assert sorted(finished[3:]) == ["batch0", "batch1", "batch2"]


def test_priority_out_of_range_is_a_400(server: Server) -> None:
    answer = httpx.post(
        f"{server.v1}/chat/completions",
        headers={"Authorization": "Bearer sk-app"},
        json={"messages": [{"role": "user", "content": "x"}], "priority": 2**40},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "priority"
