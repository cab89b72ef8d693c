"""Several models in one real server: two chat models and an embedding model under a
memory budget that fits two, a pinned model, a broken one, aliases, the admin routes and
``/v1/embeddings`` through the official client."""

from __future__ import annotations

import base64
import concurrent.futures
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import openai
import pytest

from mlxcore.testing.server import Server, ServerFactory

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("multi-model")]

PROMPTS = ["Hello there", "Count to three", "Name a colour"]


def weights(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


@pytest.fixture(scope="module")
def embed_model(mlxcore_model_factory: Any) -> Path:
    path: Path = mlxcore_model_factory("qwen3", seed=1)
    return path


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory: pytest.TempPathFactory, tiny_qwen3: Path) -> Path:
    folder = tmp_path_factory.mktemp("broken")
    for item in tiny_qwen3.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, folder / item.name)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    return folder


@pytest.fixture(scope="module")
def server(
    mlxcore_server: ServerFactory,
    tiny_qwen3: Path,
    tiny_llama: Path,
    embed_model: Path,
    broken_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    config = tmp_path_factory.mktemp("models") / "models.toml"
    config.write_text(
        f"""
[models.llama]
source = "{tiny_llama}"
aliases = ["small"]
pinned = true
max-num-seqs = 4
plugins = ["mlxcore.testing.scripted"]

[models.embed]
source = "{embed_model}"
task = "embed"

[models.broken]
source = "{broken_model}"
"""
    )
    budget = int(2.5 * max(weights(tiny_qwen3), weights(tiny_llama), weights(embed_model)))
    return mlxcore_server(
        tiny_qwen3,
        "--served-model-name",
        "qwen",
        "--models-config",
        str(config),
        "--models-memory-budget",
        str(budget),
    )


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def single_answers(mlxcore_server: ServerFactory, tiny_qwen3: Path, tiny_llama: Path) -> Any:
    """What a one-model server of each chat model answers to each prompt."""
    answers: dict[tuple[str, str], str] = {}
    for name, path in (("qwen", tiny_qwen3), ("llama", tiny_llama)):
        alone = mlxcore_server(path)
        own = openai.OpenAI(base_url=alone.v1, api_key="unused", max_retries=0)
        for prompt in PROMPTS:
            answers[name, prompt] = complete(own, None, prompt)
        alone.stop()
    return answers


def complete(client: openai.OpenAI, model: str | None, prompt: str) -> str:
    reply = client.completions.create(
        model=model or "", prompt=prompt, max_tokens=12, temperature=0
    )
    return reply.choices[0].text


def states(server: Server) -> dict[str, str]:
    body = httpx.get(f"{server.v1}/models", timeout=30).json()
    return {m["id"]: m["state"] for m in body["data"]}


def metric(server: Server, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}\{{{re.escape(wanted)}\}} (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_models_lists_every_model_with_state_and_context(server: Server) -> None:
    body = httpx.get(f"{server.v1}/models", timeout=30).json()
    by_id = {m["id"]: m for m in body["data"]}
    assert list(by_id) == ["qwen", "llama", "small", "embed", "broken"]
    assert by_id["small"]["alias_of"] == "llama"
    assert by_id["llama"]["pinned"] is True and by_id["embed"]["task"] == "embed"
    assert by_id["qwen"]["state"] == "loaded" and by_id["llama"]["state"] == "loaded"
    assert by_id["embed"]["state"] == "not_loaded"
    assert all(isinstance(m["context_length"], int) for m in body["data"])
    one = httpx.get(f"{server.v1}/models/small", timeout=30).json()
    assert one["id"] == "small" and one["alias_of"] == "llama"


@pytest.mark.long
def test_alternating_models_answer_as_alone_and_evict_the_lru(
    server: Server, client: openai.OpenAI, single_answers: Any
) -> None:
    sequence = ["qwen", "embed", "small", "qwen", "embed", "llama", "qwen"]
    for step, model in enumerate(sequence):
        prompt = PROMPTS[step % len(PROMPTS)]
        if model == "embed":
            vectors = client.embeddings.create(model="embed", input=[prompt]).data
            assert len(vectors) == 1
            seen = states(server)
            assert seen["embed"] == "loaded" and seen["qwen"] == "not_loaded"
        else:
            own = "llama" if model == "small" else model
            assert complete(client, model, prompt) == single_answers[own, prompt]
            assert states(server)[own] == "loaded"
        assert states(server)["llama"] == "loaded"  # pinned: never unloaded
    assert metric(server, "mlxcore_model_loads_total", model="qwen", result="loaded") >= 3
    assert metric(server, "mlxcore_model_unloads_total", model="qwen") >= 2
    assert metric(server, "mlxcore_model_unloads_total", model="llama") == 0


def test_concurrent_requests_across_models_all_succeed(
    client: openai.OpenAI, single_answers: Any
) -> None:
    jobs = [(m, p) for p in PROMPTS for m in ("qwen", "llama", "embed")] * 2

    def run(job: tuple[str, str]) -> tuple[str, str, Any]:
        model, prompt = job
        if model == "embed":
            return model, prompt, client.embeddings.create(model=model, input=prompt).data
        return model, prompt, complete(client, model, prompt)

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    for model, prompt, got in results:
        if model == "embed":
            assert len(got) == 1 and len(got[0].embedding) > 0
        else:
            assert got == single_answers[model, prompt]


def test_a_broken_model_fails_clearly_and_the_others_serve(
    server: Server, client: openai.OpenAI
) -> None:
    for _ in range(2):  # the second answer repeats the failure without reloading
        with pytest.raises(openai.APIStatusError) as failed:
            complete(client, "broken", "Hi")
        assert failed.value.status_code == 503
        error = failed.value.body
        assert isinstance(error, dict) and error["code"] == "model_unavailable"
        assert "could not be loaded" in error["message"]
    assert metric(server, "mlxcore_model_loads_total", model="broken", result="failed") == 1
    assert states(server)["broken"] == "failed"
    assert complete(client, "llama", "Hi")
    assert server.health()["status"] == "ok"


def test_a_plugin_enabled_for_one_model_acts_on_that_model_only(client: openai.OpenAI) -> None:
    def scripted(model: str) -> str:
        reply = client.completions.create(
            model=model, prompt="Hi", max_tokens=8, temperature=0,
            extra_body={"test_script": "Hi there."},
        )  # fmt: skip
        return reply.choices[0].text

    assert scripted("llama") == "Hi there."
    assert scripted("qwen") != "Hi there."


def test_unknown_model_is_a_404_naming_the_models(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        complete(client, "gpt-4o", "Hi")
    message = str(missing.value)
    assert "qwen" in message and "small" in message and "embed" in message


def test_chat_on_the_embedding_model_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(
            model="embed", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )


def test_admin_routes_unload_and_load(server: Server) -> None:
    unloaded = httpx.post(f"{server.v1}/models/embed/unload", timeout=60)
    assert unloaded.status_code == 200 and unloaded.json()["state"] == "not_loaded"
    loaded = httpx.post(f"{server.v1}/models/embed/load", timeout=120)
    assert loaded.status_code == 200 and loaded.json()["state"] == "loaded"
    assert states(server)["embed"] == "loaded"
    missing = httpx.post(f"{server.v1}/models/nope/load", timeout=60)
    assert missing.status_code == 404


# -- embeddings ------------------------------------------------------------------


def reference_embeddings(path: Path, texts: list[str]) -> list[list[float]]:
    """Last-token hidden state of the transformer body, L2-normalised: computed here
    one text at a time with mlx-lm directly."""
    from mlx_lm import load

    model, tokenizer = load(str(path))
    out = []
    for text in texts:
        hidden = model.model(mx.array([tokenizer.encode(text)]))[0, -1].astype(mx.float32)
        out.append((hidden / mx.linalg.norm(hidden)).tolist())
    return out


def test_embeddings_match_an_in_process_reference(client: openai.OpenAI, embed_model: Path) -> None:
    texts = ["The quick brown fox", "jumps", "over the lazy dog, twice over and again"]
    reply = client.embeddings.create(model="embed", input=texts)
    assert [d.index for d in reply.data] == [0, 1, 2]
    assert reply.usage.prompt_tokens > len(texts)
    expected = reference_embeddings(embed_model, texts)
    for got, want in zip(reply.data, expected, strict=True):
        assert len(got.embedding) == len(want)
        assert max(abs(a - b) for a, b in zip(got.embedding, want, strict=True)) < 1e-5
    packed = client.embeddings.create(model="embed", input=texts, encoding_format="base64")
    for item, want in zip(packed.data, expected, strict=True):
        raw = item.embedding
        values = (
            struct.unpack(f"<{len(want)}f", base64.b64decode(raw)) if isinstance(raw, str) else raw
        )
        assert max(abs(a - b) for a, b in zip(values, want, strict=True)) < 1e-5


def gauge(server: Server, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"no {name} in /metrics"
    return float(match.group(1))


def test_an_embedding_during_a_decode_batch_is_an_engine_job(
    client: openai.OpenAI, server: Server
) -> None:
    stream = client.chat.completions.create(
        model="qwen",
        messages=[{"role": "user", "content": "Tell a long story"}],
        max_tokens=300,
        stream=True,
    )
    chunks = iter(stream)
    next(chunks)  # the engine is decoding this request now (qwen is loaded)
    before = gauge(server, "mlxcore_embedding_jobs_completed")  # summed over loaded models
    data = client.embeddings.create(model="qwen", input=["while it decodes"]).data
    health = httpx.get(f"{server.base_url}/health", timeout=30).json()
    assert len(data[0].embedding) > 0
    assert health["running"] >= 1 and health["jobs"] == {"running": 0, "waiting": 0}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert gauge(server, "mlxcore_embedding_jobs_completed") == before + 1
    assert gauge(server, "mlxcore_embedding_jobs_failed") == 0


def test_embeddings_token_input_and_dimensions(client: openai.OpenAI) -> None:
    by_text = client.embeddings.create(model="embed", input="hello").data[0].embedding
    ids = httpx.post(
        f"{client.base_url}embeddings",
        json={"model": "embed", "input": "hello", "dimensions": 8},
        timeout=60,
    ).json()["data"][0]["embedding"]
    assert len(ids) == 8
    assert abs(sum(v * v for v in ids) - 1.0) < 1e-4
    assert len(by_text) > 8


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": [[1, 2], "x", 3]}, "input[2]"),
        ({"input": [[10**9]]}, "input[0]"),
        ({"input": "hi", "dimensions": 0}, "dimensions"),
        ({"input": "hi", "dimensions": 10**6}, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_bad_embedding_requests_are_400s(server: Server, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(f"{server.v1}/embeddings", json={"model": "embed", **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_idle_models_are_unloaded(
    mlxcore_server: ServerFactory, tiny_qwen3: Path, tiny_llama: Path
) -> None:
    idle = mlxcore_server(tiny_qwen3, "--model", f"llama={tiny_llama}", "--idle-unload", "2")
    own = openai.OpenAI(base_url=idle.v1, api_key="unused", max_retries=0)
    assert complete(own, "llama", "Hi")
    deadline = time.monotonic() + 20
    while states(idle)["llama"] != "not_loaded" and time.monotonic() < deadline:
        time.sleep(0.5)
    assert states(idle)["llama"] == "not_loaded"
    assert complete(own, "llama", "Hi")  # and it comes back on demand
    idle.stop()


@pytest.mark.long
def test_unloading_frees_the_model_over_ten_cycles(mlxcore_server: ServerFactory) -> None:
    """After ``/v1/models/{id}/unload`` MLX holds nothing of the model; after each load
    it holds one copy again (it used to keep the old one: 2x after unload + load)."""
    from mlxcore.models.default import ensure_default_model

    smol = mlxcore_server(ensure_default_model(), "--served-model-name", "smol")
    body = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}

    def active() -> int:
        return int(
            httpx.get(f"{smol.base_url}/health", timeout=30).json()["memory"]["mlx_active_bytes"]
        )

    assert httpx.post(f"{smol.v1}/chat/completions", json=body, timeout=60).status_code == 200
    baseline = active()
    assert baseline > 100 * 2**20  # SmolLM2-135M in float32
    for cycle in range(10):
        assert httpx.post(f"{smol.v1}/models/smol/unload", timeout=60).status_code == 200
        assert active() < 0.05 * baseline, cycle
        assert httpx.post(f"{smol.v1}/models/smol/load", timeout=120).status_code == 200
        assert httpx.post(f"{smol.v1}/chat/completions", json=body, timeout=60).status_code == 200
        assert abs(active() - baseline) <= 0.05 * baseline, (cycle, active(), baseline)
