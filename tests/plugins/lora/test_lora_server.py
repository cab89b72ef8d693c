"""LoRA adapters through a real server and the official openai SDK: adapters listed as
models of their own (``parent``: the base), each answering as the in-process engine does
for that adapter, streamed and not, many at once in one batch; vLLM's runtime load and
unload routes; bad requests answered with 4xx in the API's error shape."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from mlxcore_lora.testing import write_adapter

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("lora")]

KEY = "lora-key"
PROMPT = "Tell me about the sea"


@pytest.fixture(scope="module")
def folders(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("served-adapters")
    return {
        "ada": write_adapter(tiny_qwen3, root / "ada", rank=8, seed=11),
        "bob": write_adapter(
            tiny_qwen3, root / "bob", rank=4, scale=20.0, keys=["mlp.down_proj"], seed=12
        ),
        "cid": write_adapter(
            tiny_qwen3, root / "cid", rank=2, scale=30.0, keys=["self_attn.o_proj"], seed=13
        ),
    }


@pytest.fixture(scope="module")
def server(mlxcore_server: Any, tiny_qwen3: Path, folders: dict[str, Path]) -> Any:
    return mlxcore_server(
        tiny_qwen3,
        "--plugin", "lora",
        "--lora", f"ada={folders['ada']}", f"bob={folders['bob']}",
        "--allow-runtime-lora",
        "--max-loras", "3",
        "--served-model-name", "tiny",
        "--api-key", KEY,
    )  # fmt: skip


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=KEY, max_retries=0)


def admin(server: Any, route: str, body: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(f"{server.v1}/{route}", json=body, headers=headers, timeout=60)


def complete(client: openai.OpenAI, model: str, prompt: str = PROMPT, **kw: Any) -> str:
    answer = client.completions.create(
        model=model, prompt=prompt, max_tokens=16, temperature=0, **kw
    )
    assert answer.model == model
    return answer.choices[0].text


def test_adapters_are_models_with_a_parent(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list().data}
    assert {"tiny", "ada", "bob"} <= set(models)
    assert models["ada"].model_extra["parent"] == "tiny"
    assert models["tiny"].model_extra["parent"] is None
    assert client.models.retrieve("bob").model_extra["root"].endswith("bob")


def test_each_adapter_answers_its_own_way_streamed_and_not(client: openai.OpenAI) -> None:
    texts = {model: complete(client, model) for model in ("tiny", "ada", "bob")}
    assert len(set(texts.values())) == 3, texts  # the adapters change the output
    for model, text in texts.items():
        stream = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=16, temperature=0, stream=True
        )
        assert "".join(c.choices[0].text for c in stream if c.choices) == text
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=8, temperature=0
        )
        assert chat.model == model and chat.choices[0].finish_reason in ("length", "stop")


def test_many_adapters_at_once_answer_as_alone(client: openai.OpenAI) -> None:
    prompts = [f"{PROMPT} number {i}" for i in range(4)]
    jobs = [(model, prompt) for model in ("tiny", "ada", "bob") for prompt in prompts]
    alone = {job: complete(client, *job) for job in jobs}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = dict(zip(jobs, pool.map(lambda job: complete(client, *job), jobs), strict=True))
    assert together == alone


def test_runtime_load_use_unload(
    server: Any, client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    loaded = admin(
        server, "load_lora_adapter", {"lora_name": "cid", "lora_path": str(folders["cid"])}
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["parent"] == "tiny"
    assert "cid" in {m.id for m in client.models.list().data}
    text = complete(client, "cid")
    assert text != complete(client, "tiny")
    again = admin(
        server, "load_lora_adapter", {"lora_name": "cid", "lora_path": str(folders["cid"])}
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "adapter_exists"
    gone = admin(server, "unload_lora_adapter", {"lora_name": "cid"})
    assert gone.status_code == 200, gone.text
    with pytest.raises(openai.NotFoundError):
        complete(client, "cid")
    assert admin(server, "unload_lora_adapter", {"lora_name": "cid"}).status_code == 404
    reloaded = admin(
        server, "load_lora_adapter", {"lora_name": "cid", "lora_path": str(folders["cid"])}
    )
    assert (
        reloaded.status_code == 200 and complete(client, "cid") == text
    )  # same weights, same text
    assert admin(server, "unload_lora_adapter", {"lora_name": "cid"}).status_code == 200


def test_unload_waits_for_running_requests(
    server: Any, client: openai.OpenAI, folders: dict[str, Path]
) -> None:
    weights = server.health()["memory"]["weights_bytes"]
    assert (
        admin(
            server, "load_lora_adapter", {"lora_name": "cid", "lora_path": str(folders["cid"])}
        ).status_code
        == 200
    )
    assert server.health()["memory"]["weights_bytes"] > weights  # counted in the budget
    ask = {
        "model": "cid",
        "prompt": PROMPT,
        "max_tokens": 120,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    expected = client.completions.create(**ask).choices[0].text
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(client.completions.create, **ask)
        deadline = time.monotonic() + 60
        while server.health()["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not running.done(), "the request ended before the unload could meet it"
        gone = admin(server, "unload_lora_adapter", {"lora_name": "cid"})
        assert gone.status_code == 200
        finished = running.result(timeout=120)
    # the adapter's weights stayed until its request ended: the same text as alone
    assert finished.usage.completion_tokens == 120 and finished.choices[0].text == expected
    assert server.health()["memory"]["weights_bytes"] == weights


@pytest.mark.parametrize(
    ("route", "body", "status", "param"),
    [
        ("load_lora_adapter", {"lora_name": "x"}, 400, None),
        ("load_lora_adapter", {"lora_name": "has space", "lora_path": "/tmp"}, 400, None),
        ("load_lora_adapter", {"lora_name": "x", "lora_path": "/does/not/exist"}, 400, "lora_path"),
        ("load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp"}, 400, "lora_path"),
        ("load_lora_adapter", {"lora_name": "tiny", "lora_path": "/tmp"}, 409, "lora_name"),
        (
            "load_lora_adapter",
            {"lora_name": "x", "lora_path": "/tmp", "model": "nope"},
            404,
            "model",
        ),
        ("unload_lora_adapter", {"lora_name": "never-loaded"}, 404, "lora_name"),
        ("unload_lora_adapter", {"lora_name": 3}, 400, None),
    ],
)
def test_bad_admin_requests(
    server: Any, route: str, body: Any, status: int, param: str | None
) -> None:
    answer = admin(server, route, body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["message"]
    if param is not None:
        assert error["param"] == param


def test_too_many_adapters_is_a_conflict(
    server: Any, folders: dict[str, Path], tmp_path: Path
) -> None:
    assert (
        admin(
            server, "load_lora_adapter", {"lora_name": "c1", "lora_path": str(folders["cid"])}
        ).status_code
        == 200
    )
    full = admin(server, "load_lora_adapter", {"lora_name": "c2", "lora_path": str(folders["cid"])})
    assert full.status_code == 409 and "--max-loras" in full.json()["error"]["message"]
    assert admin(server, "unload_lora_adapter", {"lora_name": "c1"}).status_code == 200


def test_adapter_names_elsewhere(client: openai.OpenAI, server: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="LoRA adapter"):
        client.embeddings.create(model="ada", input="hello")
    with pytest.raises(openai.NotFoundError):
        complete(client, "not-an-adapter")
    # a body field named like the engine's option is not a way around the model name
    assert complete(client, "tiny", extra_body={"adapter": 1}) == complete(client, "tiny")
    assert server.alive()


def test_responses_and_messages_take_an_adapter_name(server: Any, client: openai.OpenAI) -> None:
    import anthropic

    replies = {
        m: client.responses.create(model=m, input=PROMPT, max_output_tokens=12, temperature=0)
        for m in ("tiny", "ada")
    }
    assert replies["ada"].model == "ada"
    assert replies["ada"].output_text != replies["tiny"].output_text
    messages = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
    answer = messages.messages.create(
        model="bob", max_tokens=12, messages=[{"role": "user", "content": PROMPT}]
    )
    assert answer.model == "bob" and answer.usage.output_tokens > 0
