"""Distributed serving end to end: ``mlxcore launch`` starts two ring ranks on 127.0.0.1
serving a float32 test model split tensor- or pipeline-parallel; rank 0's HTTP answers
must be the single-process server's, token for token, with the official openai client:
alone, streamed and not, 8 at once, a 4,096-token prompt, a tool call through the
parsers and a second turn that hits the prefix cache. Killing rank 1 mid-stream ends
every open request with an error, ``/health`` turns 503 and the launcher exits non-zero;
a model that cannot be split is refused before loading, in one line."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from mlxcore.testing.models import build_test_model
from mlxcore.testing.ranks import LaunchedGroup, launch_group, write_hostfile
from mlxcore.testing.server import Server, ServerFactory, free_port

pytestmark = [pytest.mark.xdist_group("ranks"), pytest.mark.long]

SCRIPTED = ("--plugin", "mlxcore.testing.scripted", "--plugin", "anthropic")
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
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
    ("llama", "--tensor-parallel"),
    ("qwen3_5", "--tensor-parallel"),
    ("qwen3_5", "--pipeline-parallel"),
    ("qwen3", "--tensor-parallel"),  # last: the tests below use its group
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


@pytest.fixture(scope="module")
def groups(logs: Path) -> Iterator[Any]:
    """A two-rank group of (architecture, mode); one group runs at a time (asking for
    another stops the previous one)."""
    started: dict[tuple[str, str], LaunchedGroup] = {}

    def get(arch: str, mode: str) -> LaunchedGroup:
        if (arch, mode) not in started:
            for group in started.values():
                group.stop()
            started.clear()
            started[arch, mode] = launch_group(build_test_model(arch), logs, mode, *SCRIPTED)
        return started[arch, mode]

    yield get
    for group in started.values():
        group.stop()


@pytest.mark.parametrize(("arch", "mode"), CASES)
def test_two_ranks_answer_what_one_process_does(
    arch: str, mode: str, single: Any, groups: Any
) -> None:
    reference = single(arch)
    group = groups(arch, mode)
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


def test_cancellations_stops_sampling_and_anthropic_keep_the_ranks_in_step(
    single: Any, groups: Any
) -> None:
    """What only rank 0 sees (a client leaving, a stop string, a sampled request without
    a seed) reaches every rank through the step message: the ranks' checksums still
    agree afterwards, and greedy answers (Anthropic's and structured output's too) are
    still the single process's."""
    reference, group = single("qwen3"), groups("qwen3", "--tensor-parallel")
    api = client(group)
    model = api.models.list().data[0].id
    for i in range(3):  # clients that leave mid-stream
        stream = api.chat.completions.create(
            model=model, messages=user(f"long story {i}"), max_tokens=400, stream=True
        )
        for n, _ in enumerate(stream):
            if n == 5 + i:
                break
        stream.close()
    full = chat(reference, user("stop here"), False)[0].split("|", 1)[1]
    stop = full.split()[2] if len(full.split()) > 2 else full[:3]
    stopped = chat(group, user("stop here"), True, stop=[stop])
    assert stopped[:2] == chat(reference, user("stop here"), False, stop=[stop])[:2]
    for seed in (None, 7):
        sampled = api.chat.completions.create(
            model=model, messages=user("pick"), max_tokens=12, temperature=1.0, seed=seed
        )
        assert sampled.usage is not None and sampled.usage.completion_tokens > 0
    messages = anthropic.Anthropic(base_url=group.base_url, api_key="none", max_retries=0)
    answer = messages.messages.create(
        model=model,
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=12,
        extra_body={"temperature": 0},
    )
    reference_answer = anthropic.Anthropic(
        base_url=reference.base_url, api_key="none", max_retries=0
    ).messages.create(
        model=reference_name(reference),
        messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=12,
        extra_body={"temperature": 0},
    )
    assert answer.content == reference_answer.content
    person = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}
    shape = {"max_tokens": 120, "response_format": fmt, "extra_body": NO_THINKING}
    shaped = chat(group, user("Someone?"), False, **shape)
    assert shaped[:2] == chat(reference, user("Someone?"), False, **shape)[:2]
    value = json.loads(shaped[0].split("|", 1)[1])
    assert set(value) == {"name", "age"}
    again = user("Tell me about the number 1, please.")
    assert chat(group, again, False)[:3] == chat(reference, again, False)[:3]
    assert group.health()["status"] == "ok"
    assert metric(group, "mlxcore_distributed_checks") > 0


def test_stopping_the_launcher_stops_every_rank_cleanly(groups: Any) -> None:
    group = groups("qwen3", "--tensor-parallel")
    group.stop()
    assert group.proc.returncode == 0, group.log()
    for rank in (0, 1):  # rank 0 drained, then told rank 1 to stop: neither was killed
        assert f"rank {rank} (127.0.0.1) exited with status 0" in group.log()


def reference_name(server: Server) -> str:
    return client(server).models.list().data[0].id


def metric(server: Server, name: str) -> float:
    for line in httpx.get(f"{server.base_url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["dies", "hangs"])
def test_losing_a_rank_ends_every_open_request_and_the_group(logs: Path, how: int) -> None:
    """A rank that dies is noticed at the next collective; one that hangs (stopped) by
    the step deadline (``--distributed-timeout``, 15 s here: a loaded 2-core machine can
    take 5 s over a step), and so is a dead rank when mlx's collective waits forever
    instead of raising (it does either)."""
    group = launch_group(
        build_test_model("qwen3"),
        logs,
        "--distributed-timeout",
        "15",
        launcher=("--grace", "30"),  # longer than the deadline, as by default (30 > 20)
    )
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
        started = time.monotonic()  # a loaded 2-core machine may take a while to admit all three
        while group.health()["running"] < 3 and time.monotonic() - started < 60:
            time.sleep(0.2)
        assert group.health()["running"] == 3
        killed_at = time.monotonic()
        os.kill(group.ranks()[1], how)
        statuses = set()
        while time.monotonic() - killed_at < 60 and group.alive():
            try:
                statuses.add(httpx.get(f"{group.base_url}/health", timeout=2).status_code)
            except httpx.HTTPError:
                statuses.add(-1)
            if 503 in statuses and not any(t.is_alive() for t in threads):
                break
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=max(1.0, 60 - (time.monotonic() - killed_at)))
        assert sorted(outcomes) == [0, 1, 2]
        for kind, at in outcomes.values():
            assert kind != "finished"
            assert at - killed_at < 60
        assert 503 in statuses
        code = group.proc.wait(timeout=60)
        assert code != 0
        assert "a rank of the distributed group was lost" in group.log()
    finally:
        group.stop()


def test_an_engine_fault_fails_one_request_or_stops_the_whole_group(logs: Path) -> None:
    """With the fault-injection plugin on both ranks: a request that makes every decode
    step of its batch raise is found on every rank alike (the batch retried without half
    of it) and fails alone while the others finish and the group serves on; a fault that
    escapes the step ends every open request, ``/health`` turns 503, and both ranks exit
    non-zero well before the step deadline (a distributed engine does not restart)."""
    group = launch_group(build_test_model("qwen3"), logs, "--plugin", "mlxcore.testing.faults")
    try:
        api = client(group)
        model = api.models.list().data[0].id

        def ask(i: int, fault: str | None = None) -> str:
            extra = {"fault": fault} if fault else {}
            try:
                r = api.chat.completions.create(
                    model=model,
                    messages=user(f"count {i}"),
                    max_tokens=24,
                    temperature=0,
                    extra_body=extra,
                )
                return r.choices[0].finish_reason or ""
            except (openai.APIError, httpx.HTTPError) as exc:
                return type(exc).__name__

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            done = list(pool.map(ask, range(5), [None, None, "decoder:poison", None, None]))
        assert done[2] not in ("length", "stop")
        assert [d for i, d in enumerate(done) if i != 2] == ["length"] * 4
        assert group.health()["status"] == "ok"
        assert ask(9) == "length"

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            running = [pool.submit(ask, i) for i in range(3)]
            faulted_at = time.monotonic()
            fault = pool.submit(ask, 3, "decoder-remove:raise")
            outcomes = [f.result(timeout=60) for f in [*running, fault]]
        assert "length" not in outcomes[3]
        code = group.proc.wait(timeout=60)
        assert code != 0
        assert time.monotonic() - faulted_at < 20  # the step deadline: no rank waited it out
        assert "a distributed engine does not restart" in group.log()
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


def test_ranks_started_with_different_flags_are_refused_before_loading(tmp_path: Path) -> None:
    model = str(build_test_model("qwen3"))
    hostfile = write_hostfile(tmp_path / "hosts.json", 2)
    procs = []
    for rank, extra in enumerate([[], ["--max-num-seqs", "4"]]):
        cmd = [sys.executable, "-m", "mlxcore", "serve", model, "--distributed", *extra]
        cmd += ["--port", str(free_port())]
        env = {**os.environ, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    try:
        outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            p.kill()
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 2, out
        assert "rank(s) 1 disagree with rank 0 on the model files, the engine flags" in out
        assert "mlxcore.models.loader: loaded" not in out


def test_a_strategy_that_cannot_run_in_lockstep_is_refused_with_its_name(logs: Path) -> None:
    group = launch_group(build_test_model("qwen3"), logs, "--plugin", "prompt-lookup", wait=False)
    try:
        code = group.proc.wait(timeout=120)
    finally:
        group.stop()
    assert code == 2, group.log()
    refusals = [line for line in group.log().splitlines() if "mlxcore: error:" in line]
    assert len(refusals) == 2
    assert all("decoder 'prompt-lookup' does not run distributed yet" in r for r in refusals)
