"""The rerank plugin in a real server: ``/v1/rerank`` (and ``/rerank``, ``/v2/rerank``)
and ``/score`` answer the in-process scores within 1e-5 (httpx in the Cohere/Jina shape,
Cohere's own SDK), bad input is a 400 in the API's error shape, and reranks share the
engine with chats under load."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import cohere
import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load

from mlxcore.testing.server import Server, ServerFactory
from mlxcore_rerank.scoring import Answers, pair_tokens

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUERY = "Which city is the capital of France?"
DOCUMENTS = [
    "The Eiffel Tower stands in Paris.",
    "Paris is the capital of France.",
    "Bananas are rich in potassium.",
    "France borders Spain, Italy and Germany. " * 5,
]


@pytest.fixture(scope="module")
def reranker(mlxcore_model_factory: Any) -> Path:
    path: Path = mlxcore_model_factory("qwen3", seed=7)
    return path


@pytest.fixture(scope="module")
def server(
    mlxcore_server: ServerFactory,
    tiny_llama: Path,
    reranker: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    config = tmp_path_factory.mktemp("rerank") / "models.toml"
    config.write_text(
        f"""
[models.rerank]
source = "{reranker}"
task = "rerank"
context-length = 400
"""
    )
    return mlxcore_server(tiny_llama, "--served-model-name", "chat", "--models-config", str(config))


@pytest.fixture(scope="module")
def expected(reranker: Path) -> list[float]:
    """Each document's score in process: the pair alone through mlx-lm's model call."""
    model, tokenizer = load(str(reranker))
    answers = Answers.of(tokenizer)
    out = []
    for document in DOCUMENTS:
        logits = model(mx.array([pair_tokens(tokenizer, QUERY, document)]))[0, -1]
        pair = mx.softmax(mx.stack([logits[answers.no], logits[answers.yes]]).astype(mx.float32))
        out.append(float(pair[1].item()))
    return out


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_orders_the_documents_by_their_in_process_scores(
    server: Server, expected: list[float], path: str
) -> None:
    documents: list[Any] = [DOCUMENTS[0], *({"text": d} for d in DOCUMENTS[1:])]
    answer = post(server, path, {"model": "rerank", "query": QUERY, "documents": documents})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    results = body["results"]
    assert [r["index"] for r in results] == sorted(range(4), key=lambda i: -expected[i])
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-5)
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    assert body["model"] == "rerank" and body["usage"]["total_tokens"] > 4 * 40
    top = post(
        server,
        path,
        {"model": "rerank", "query": QUERY, "documents": DOCUMENTS, "top_n": 2,
         "return_documents": False},
    ).json()["results"]  # fmt: skip
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]]
    assert all("document" not in r for r in top)


def test_score_pairs_one_text_with_many_and_two_lists(
    server: Server, expected: list[float]
) -> None:
    one = post(server, "/score", {"model": "rerank", "text_1": QUERY, "text_2": DOCUMENTS})
    assert one.status_code == 200, one.text
    data = one.json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2, 3]
    assert [d["score"] for d in data] == pytest.approx(expected, abs=1e-5)
    pairs = post(
        server,
        "/v1/score",
        {"model": "rerank", "text_1": [QUERY, QUERY], "text_2": DOCUMENTS[2:]},
    ).json()
    assert [d["score"] for d in pairs["data"]] == pytest.approx(expected[2:], abs=1e-5)
    assert pairs["object"] == "list" and pairs["usage"]["prompt_tokens"] > 0


def test_cohere_sdk_reranks_through_the_server(server: Server, expected: list[float]) -> None:
    client = cohere.ClientV2(api_key="unused", base_url=server.base_url)
    answer = client.rerank(model="rerank", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in answer.results] == sorted(range(4), key=lambda i: -expected[i])[:3]
    for r in answer.results:
        assert r.relevance_score == pytest.approx(expected[r.index], abs=1e-5)


BAD = [
    ("/v1/rerank", {"model": "rerank", "documents": ["a"]}, "query"),
    ("/v1/rerank", {"model": "rerank", "query": "", "documents": ["a"]}, "query"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": [3]}, "documents"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"model": "rerank", "query": "q", "documents": ["x"] * 10_000}, "documents"),
    ("/score", {"model": "rerank", "text_1": ["a", "b"], "text_2": ["c"] * 3}, "text_2"),
    ("/score", {"model": "rerank", "text_1": "a", "text_2": []}, "text_2"),
    ("/score", {"model": "rerank", "text_1": "a", "text_2": ["b"] * 1001}, "text_2"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_bad_input_is_a_400_naming_the_field(
    server: Server, path: str, body: dict[str, Any], param: str
) -> None:
    answer = post(server, path, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert param in (error.get("param") or "") + error["message"]


def test_a_pair_longer_than_the_context_is_a_400(server: Server) -> None:
    def ask(max_tokens_per_doc: int) -> httpx.Response:
        body = {"model": "rerank", "query": QUERY, "documents": ["short", "word " * 2000]}
        return post(server, "/v1/rerank", body | {"max_tokens_per_doc": max_tokens_per_doc})

    answer = ask(5000)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert answer.json()["error"]["param"] == "documents[1]"
    fine = ask(100)  # cut to max_tokens_per_doc, the same document fits
    assert fine.status_code == 200, fine.text


def test_a_chat_model_scores_the_decoder_reranker_way(server: Server) -> None:
    """As any decoder model answers /v1/embeddings, any chat model can be asked to
    rerank (a trained reranker only scores better)."""
    answer = post(server, "/score", {"model": "chat", "text_1": QUERY, "text_2": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    assert all(0.0 < d["score"] < 1.0 for d in answer.json()["data"])


def test_chat_on_the_reranker_is_a_400(server: Server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="reranker"):
        client.chat.completions.create(
            model="rerank", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )


def test_reranks_and_chats_share_the_engine(server: Server, expected: list[float]) -> None:
    """16 reranks and 16 chats at once: every one answers, the scores unchanged."""
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)

    def rerank(_: int) -> list[float]:
        answer = post(server, "/score", {"model": "rerank", "text_1": QUERY, "text_2": DOCUMENTS})
        assert answer.status_code == 200, answer.text
        return [d["score"] for d in answer.json()["data"]]

    def chat(i: int) -> str:
        reply = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"Say {i}"}], max_tokens=16
        )
        return reply.choices[0].finish_reason or ""

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        scores = list(pool.map(rerank, range(16)))
        reasons = list(pool.map(chat, range(16)))
    assert all(s == pytest.approx(expected, abs=1e-5) for s in scores)
    assert all(r in ("stop", "length") for r in reasons)


def test_langchains_cohere_reranker_compresses_documents(
    server: Server, expected: list[float]
) -> None:
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(
        model="rerank", cohere_api_key="unused", base_url=server.base_url, top_n=2
    )
    documents = [Document(page_content=d, metadata={"n": i}) for i, d in enumerate(DOCUMENTS)]
    kept = reranker.compress_documents(documents, QUERY)
    best = sorted(range(4), key=lambda i: -expected[i])[:2]
    assert [d.metadata["n"] for d in kept] == best
    for d in kept:
        assert d.metadata["relevance_score"] == pytest.approx(expected[d.metadata["n"]], abs=1e-5)


def _fuzz_bodies(seed: int, count: int) -> list[Any]:
    """Bodies built at random from the fields both routes read, with values of every
    JSON type, in and out of range (seeded, so a failure reproduces)."""
    import random

    rng = random.Random(seed)
    values: list[Any] = [
        None, True, 0, -1, 1, 2**40, 1.5, "", "q", "x" * 3000, [], [""], ["a", "b"],
        [1, 2], [{"text": "d"}], [{"text": 3}], [{}], {"text": "d"}, {"a": [1]}, ["é🙂\x00"],
        [None], ["d"] * 1001,
    ]  # fmt: skip
    fields = ["model", "query", "documents", "top_n", "return_documents",
              "max_tokens_per_doc", "instruction", "text_1", "text_2"]  # fmt: skip
    bodies: list[Any] = []
    for _ in range(count):
        body: dict[str, Any] = {"model": "rerank"}
        for name in rng.sample(fields, rng.randrange(1, len(fields))):
            body[name] = rng.choice(values)
        bodies.append(body if rng.random() > 0.05 else rng.choice(values))
    return bodies


def test_generated_bad_input_never_gets_a_5xx(server: Server) -> None:
    """300 generated bodies on each route: every answer a 200 or a 4xx in the API's
    error shape, and the server still scores correctly afterwards."""
    for seed, path in enumerate(("/v1/rerank", "/score")):
        for body in _fuzz_bodies(seed, 300):
            answer = post(server, path, body)
            assert answer.status_code == 200 or 400 <= answer.status_code < 500, (body, answer)
            if answer.status_code != 200:
                assert "message" in answer.json()["error"], answer.text
    assert post(server, "/v1/rerank", {"model": "rerank", "query": QUERY,
                                       "documents": DOCUMENTS}).status_code == 200  # fmt: skip


def test_300_concurrent_connections(server: Server, expected: list[float]) -> None:
    """300 reranks at once: each is scored (as alone) or turned away with a 503, never
    a failure; the queue bound (--max-queue-size) holds."""
    import asyncio

    async def all_at_once() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            body = {"model": "rerank", "query": QUERY, "documents": DOCUMENTS}
            url = f"{server.base_url}/v1/rerank"
            return list(await asyncio.gather(*(client.post(url, json=body) for _ in range(300))))

    answers = asyncio.run(all_at_once())
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 503} and codes.count(200) >= 50, sorted(set(codes))
    for answer in answers:
        if answer.status_code == 200:
            scores = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
            assert [scores[i] for i in range(4)] == pytest.approx(expected, abs=1e-5)
    assert server.health()["status"] == "ok"
