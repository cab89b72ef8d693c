"""Distributed serving end to end: ``mlxcore launch`` starts two ring ranks on 127.0.0.1
serving a float32 test model split tensor- or pipeline-parallel; rank 0's HTTP answers
must be the single-process server's, token for token, with the official openai client:
alone, streamed and not, 8 at once, a 4,096-token prompt, a tool call through the
parsers and a second turn that hits the prefix cache. Killing rank 1 mid-stream ends
every open request with an error, ``/health`` turns 503 and the launcher exits non-zero;
a model that cannot be split is refused before loading, in one line."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mlxcore.testing.models import build_test_model
from mlxcore.testing.ranks import LaunchedGroup, launch_group
from mlxcore.testing.server import Server, ServerFactory

pytestmark = pytest.mark.xdist_group("ranks")

SCRIPTED = ("--plugin", "mlxcore.testing.scripted")
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
LONG_PROMPT = " ".join(f"item{i % 97}" for i in range(2100))  # > 4,096 tokens


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)


def chat(server: Server, messages: list[dict[str, Any]], stream: bool, **extra: Any) -> Any:
    """``(reasoning + content, finish_reason, tool_calls, usage)`` of one greedy chat
    completion."""
    api = client(server)
    model = api.models.list().data[0].id
    kwargs: dict[str, Any] = {"max_tokens": 24, "temperature": 0, **extra}
    if not stream:
        r = api.chat.completions.create(model=model, messages=messages, **kwargs)
        message = r.choices[0].message
        thought = (message.model_extra or {}).get("reasoning_content") or ""
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return thought + "|" + (message.content or ""), r.choices[0].finish_reason, calls, r.usage
    thought, content, finish, usage = "", "", None, None
    parts: dict[int, tuple[str, str]] = {}
    options = {"include_usage": True}
    for chunk in api.chat.completions.create(
        model=model, messages=messages, stream=True, stream_options=options, **kwargs
    ):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            thought += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                name, args = parts.get(call.index, ("", ""))
                if call.function is not None:
                    name += call.function.name or ""
                    args += call.function.arguments or ""
                parts[call.index] = (name, args)
    return thought + "|" + content, finish, [parts[i] for i in sorted(parts)], usage


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


CASES = [
    ("qwen3", "--tensor-parallel"),
    ("llama", "--tensor-parallel"),
    ("qwen3_5", "--tensor-parallel"),
    ("qwen3_5", "--pipeline-parallel"),
]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def single(mlxcore_server: ServerFactory) -> Iterator[Any]:
    """The single-process reference server of each model, started once."""
    servers: dict[str, Server] = {}

    def get(arch: str) -> Server:
        if arch not in servers:
            servers[arch] = mlxcore_server(build_test_model(arch), *SCRIPTED)
        return servers[arch]

    yield get


@pytest.mark.parametrize(("arch", "mode"), CASES)
def test_two_ranks_answer_what_one_process_does(
    arch: str, mode: str, single: Any, logs: Path
) -> None:
    reference = single(arch)
    group = launch_group(build_test_model(arch), logs, mode, *SCRIPTED)
    try:
        prompts = [user(f"Tell me about the number {i}, please.") for i in range(8)]
        for stream in (False, True):
            for messages in prompts[:2]:
                assert chat(group, messages, stream)[:3] == chat(reference, messages, False)[:3]
        expected = [chat(reference, m, False)[:3] for m in prompts]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda i: chat(group, prompts[i], i % 2 == 0)[:3], range(8)))
        assert together == expected

        long_out = chat(group, user(LONG_PROMPT), True, max_tokens=8)
        assert long_out[3].prompt_tokens >= 4096
        assert long_out[:3] == chat(reference, user(LONG_PROMPT), False, max_tokens=8)[:3]

        tools = {"tools": [WEATHER_TOOL], "extra_body": {"test_script": TOOL_CALL}}
        for stream in (False, True):
            called = chat(group, user("Weather in Paris?"), stream, max_tokens=40, **tools)
            assert called[1] == "tool_calls"
            assert called[2] == [("get_weather", '{"city": "Paris"}')]

        first = chat(group, prompts[3], False)
        answer = first[0].split("|", 1)[1]
        turn = [*prompts[3], {"role": "assistant", "content": answer}, *user("And then?")]
        second = chat(group, turn, False)
        assert second[3].prompt_tokens_details.cached_tokens > 0
        assert second[:3] == chat(reference, turn, False)[:3]

        metrics = httpx.get(f"{group.base_url}/metrics").text
        assert "mlxcore_distributed_ranks 2.0" in metrics
        assert "mlxcore_distributed_rank1_weights_bytes" in metrics
        assert group.alive(), group.log()
    finally:
        group.stop()
    assert group.proc.returncode == 0, group.log()


def test_losing_a_rank_ends_every_open_request_and_the_group(logs: Path) -> None:
    group = launch_group(build_test_model("qwen3"), logs)
    try:
        api = client(group)
        model = api.models.list().data[0].id
        outcomes: dict[int, tuple[str, float]] = {}

        def stream(i: int) -> None:
            try:
                for _ in api.chat.completions.create(
                    model=model,
                    messages=user(f"count {i}"),
                    max_tokens=4000,
                    stream=True,  # type: ignore[arg-type]
                ):
                    pass
                outcomes[i] = ("finished", time.monotonic())
            except (openai.APIError, httpx.HTTPError) as exc:
                outcomes[i] = (type(exc).__name__, time.monotonic())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        assert group.health()["running"] == 3
        killed_at = time.monotonic()
        os.kill(group.ranks()[1], signal.SIGKILL)
        statuses = set()
        while time.monotonic() - killed_at < 30 and group.alive():
            try:
                statuses.add(httpx.get(f"{group.base_url}/health", timeout=2).status_code)
            except httpx.HTTPError:
                statuses.add(-1)
            if 503 in statuses and not any(t.is_alive() for t in threads):
                break
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=max(1.0, 30 - (time.monotonic() - killed_at)))
        assert sorted(outcomes) == [0, 1, 2]
        for kind, at in outcomes.values():
            assert kind != "finished"
            assert at - killed_at < 30
        assert 503 in statuses
        code = group.proc.wait(timeout=60)
        assert code != 0
        assert "a rank of the distributed group was lost" in group.log()
    finally:
        group.stop()


@pytest.mark.parametrize(
    ("arch", "overrides", "mode", "reason"),
    [
        ("qwen3", {"num_attention_heads": 3, "num_key_value_heads": 1}, "--tensor-parallel",
         "num_attention_heads = 3 does not divide by 2 ranks"),
        ("llama", {}, "--pipeline-parallel", "llama: mlx-lm has no pipeline() for it"),
    ],
)  # fmt: skip
def test_a_model_that_cannot_be_split_is_refused_before_loading(
    arch: str, overrides: dict[str, int], mode: str, reason: str, logs: Path
) -> None:
    group: LaunchedGroup = launch_group(build_test_model(arch, **overrides), logs, mode, wait=False)
    try:
        code = group.proc.wait(timeout=120)
    finally:
        group.stop()
    log = group.log()
    assert code == 2, log
    refusals = [line for line in log.splitlines() if "mlxcore: error:" in line]
    assert len(refusals) == 2 and all(reason in line for line in refusals), log
    assert "loaded" not in log
