"""BERT embedding models (``BertModel`` checkpoints) on ``/v1/embeddings``: loaded by
the rerank plugin's loader through mlx-embeddings, batched padded embeddings equal
mlx-embeddings' own output for each text alone within 1e-5 (mean pooling, and the
``[CLS]`` pooling the checkpoint's sentence-transformers configuration asks for), served
by a real server through the official openai client."""

from __future__ import annotations

from pathlib import Path

import httpx
import mlx.core as mx
import openai
import pytest

from mlxcore.embeddings import normalize
from mlxcore.testing.server import Server, ServerFactory
from mlxcore_rerank.encoder import Encoder
from mlxcore_rerank.loading import load_encoder_model
from mlxcore_rerank.testing import build_encoder, run_pieces

TEXTS = [
    "Paris is the capital of France.",
    "Bananas are rich in potassium and grow in warm countries. " * 3,
    "light",
    "Which river runs through Paris?",
]


def library_embedding(model: Encoder, ids: list[int]) -> list[float]:
    """One text alone through mlx-embeddings' BERT: its own pooled, normalised vector
    (``text_embeds``: the mean), or the normalised ``[CLS]`` state."""
    out = model.model(mx.array([ids]), None, mx.ones((1, len(ids))))
    if model.pooling == "cls":
        vector: list[float] = normalize(out.last_hidden_state[:, 0])[0].tolist()
        return vector
    mean: list[float] = out.text_embeds[0].tolist()
    return mean


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_encoder(tmp_path_factory.mktemp("encoder") / "model", seed=5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_batched_embeddings_equal_the_librarys_for_each_text(pooling: str, tmp_path: Path) -> None:
    loaded = load_encoder_model(build_encoder(tmp_path / "m", seed=5, pooling=pooling))
    assert loaded is not None and isinstance(loaded.model, Encoder)
    assert loaded.model.pooling == pooling
    inputs = [list(loaded.tokenizer.encode(t)) for t in TEXTS]
    want = [library_embedding(loaded.model, ids) for ids in inputs]
    for budget in (8192, 2 * max(len(ids) for ids in inputs)):
        got = run_pieces(loaded.model.mlxcore_embedding_pieces(inputs, batch_tokens=budget))
        for row, expected in zip(got, want, strict=True):
            assert row == pytest.approx(expected, abs=1e-5)
    cut = run_pieces(loaded.model.mlxcore_embedding_pieces(inputs, dimensions=8))
    assert cut[0] == pytest.approx(list(normalize(mx.array([want[0][:8]]))[0].tolist()), abs=1e-5)


@pytest.fixture(scope="module")
def server(mlxcore_server: ServerFactory, folder: Path) -> Server:
    return mlxcore_server(folder, "--served-model-name", "bert")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_server_serves_it_on_v1_embeddings(server: Server, folder: Path) -> None:
    loaded = load_encoder_model(folder)
    assert loaded is not None
    want = [library_embedding(loaded.model, list(loaded.tokenizer.encode(t))) for t in TEXTS]
    client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
    got = client.embeddings.create(model="bert", input=TEXTS)
    assert [d.index for d in got.data] == [0, 1, 2, 3]
    for item, expected in zip(got.data, want, strict=True):
        assert item.embedding == pytest.approx(expected, abs=1e-5)
    assert got.usage.prompt_tokens == sum(len(loaded.tokenizer.encode(t)) for t in TEXTS)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(
            model="bert", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
    rerank = httpx.post(
        f"{server.base_url}/v1/rerank",
        json={"model": "bert", "query": "q", "documents": ["a"]},
        timeout=30,
    )
    assert rerank.status_code == 400 and "embedding model" in rerank.text
    too_long = client.embeddings.with_raw_response  # the positions bound the input
    with pytest.raises(openai.BadRequestError, match="context"):
        too_long.create(model="bert", input="Paris " * 400)
