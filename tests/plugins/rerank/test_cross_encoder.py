"""BERT cross-encoders: the plugin's loader reads a Hugging Face
``BertForSequenceClassification`` checkpoint (built here with seeded weights and a real
WordPiece tokenizer), batched padded scores equal each pair alone within 1e-5, long
documents are cut to the model's positions, and a real server serves it as a reranker
(without a models file: the model can do nothing else)."""

from __future__ import annotations

from pathlib import Path

import cohere
import httpx
import mlx.core as mx
import openai
import pytest

from mlxcore.errors import ModelLoadError
from mlxcore.models.resolve import resolve_model
from mlxcore.testing.server import Server, ServerFactory
from mlxcore_rerank import mlxcore_model_architectures
from mlxcore_rerank.cross_encoder import CrossEncoder, cross_pieces, pair_features
from mlxcore_rerank.loading import load_encoder_model
from mlxcore_rerank.testing import build_cross_encoder, run_pieces

QUERY = "Which city is the capital of France?"
DOCUMENTS = [
    "The Eiffel Tower stands in Paris.",
    "Paris is the capital of France.",
    "Bananas are rich in potassium.",
    "Berlin is the capital of Germany; Madrid that of Spain. " * 3,
    "",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross") / "model", seed=3)


def alone(model: CrossEncoder, ids: list[int], types: list[int]) -> float:
    """One pair through the model without padding or mask."""
    score = model(mx.array([ids]), mx.array([types]), mx.ones((1, len(ids))))
    return float(score[0].item())


@pytest.fixture(scope="module")
def expected(folder: Path) -> list[float]:
    loaded = load_encoder_model(folder)
    assert loaded is not None
    features = [pair_features(loaded.tokenizer, QUERY, d, 128, None) for d in DOCUMENTS]
    return [alone(loaded.model, ids, types) for ids, types in features]


def test_batched_scores_equal_each_pair_alone(folder: Path, expected: list[float]) -> None:
    loaded = load_encoder_model(folder)
    assert loaded is not None and isinstance(loaded.model, CrossEncoder)
    assert loaded.info.model_type == "bert"
    features = [pair_features(loaded.tokenizer, QUERY, d, 128, None) for d in DOCUMENTS]
    ids, types = features[1]
    sep = loaded.tokenizer.convert_tokens_to_ids("[SEP]")
    assert ids.count(sep) == 2 and types[0] == 0 and types[-1] == 1  # [CLS] q [SEP] d [SEP]
    for budget in (8192, 2 * max(len(i) for i, _ in features)):
        assert run_pieces(cross_pieces(loaded.model, features, budget)) == pytest.approx(
            expected, abs=1e-5
        )
    assert all(0.0 < s < 1.0 for s in expected) and len(set(expected)) == len(expected)


def test_a_long_document_is_cut_to_the_models_positions(folder: Path) -> None:
    loaded = load_encoder_model(folder)
    assert loaded is not None
    ids, types = pair_features(loaded.tokenizer, QUERY, "Paris " * 500, 128, None)
    assert len(ids) == len(types) == 128
    short, _ = pair_features(loaded.tokenizer, QUERY, "Paris " * 500, 128, 4)
    one, _ = pair_features(loaded.tokenizer, QUERY, "Paris", 128, None)
    assert len(short) == len(one) + 3
    assert loaded.tokenizer.unk_token_id not in short  # a real vocabulary


def test_other_checkpoints_are_left_to_the_other_loaders(tiny_qwen3: Path) -> None:
    assert load_encoder_model(tiny_qwen3) is None


def test_the_folder_check_accepts_what_the_plugin_loads(folder: Path) -> None:
    """mlx-lm has no BERT: the check before loading refuses the folder unless a plugin's
    ``mlxcore_model_architectures`` names its architecture."""
    with pytest.raises(ModelLoadError, match="unsupported architecture 'bert'"):
        resolve_model(str(folder))
    names = mlxcore_model_architectures()
    assert names == ["BertForSequenceClassification", "BertModel"]
    assert resolve_model(str(folder), architectures=names).path == folder.resolve()


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, folder: Path) -> Server:
    return mlxcore_server(folder, "--served-model-name", "cross")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_server_serves_it_as_a_reranker(server: Server, expected: list[float]) -> None:
    answer = httpx.post(
        f"{server.base_url}/v1/rerank",
        json={"model": "cross", "query": QUERY, "documents": DOCUMENTS},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == sorted(range(5), key=lambda i: -expected[i])
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-5)
    scored = httpx.post(
        f"{server.base_url}/score",
        json={"model": "cross", "text_1": QUERY, "text_2": DOCUMENTS},
        timeout=60,
    ).json()["data"]
    assert [d["score"] for d in scored] == pytest.approx(expected, abs=1e-5)
    sdk = cohere.ClientV2(api_key="unused", base_url=server.base_url)
    top = sdk.rerank(model="cross", query=QUERY, documents=DOCUMENTS, top_n=2).results
    assert [r.index for r in top] == [r["index"] for r in results[:2]]
    models = httpx.get(f"{server.v1}/models", timeout=10).json()["data"]
    assert models[0]["id"] == "cross"


@pytest.mark.e2e
@pytest.mark.slow
def test_chat_on_a_cross_encoder_is_a_400(server: Server) -> None:
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="reranker"):
        client.chat.completions.create(
            model="cross", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    long = httpx.post(
        f"{server.base_url}/v1/rerank",
        json={"model": "cross", "query": QUERY, "documents": ["Paris " * 2000]},
        timeout=60,
    )
    assert long.status_code == 200, long.text  # cut to the positions, as cross-encoders do
