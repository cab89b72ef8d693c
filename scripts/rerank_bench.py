"""Reranking speed: documents per second through a real server's ``/v1/rerank`` against
the same scoring in process (``mlxcore_rerank.scoring``, no HTTP, no engine).

    .venv/bin/python scripts/rerank_bench.py [--model PATH | --cross-encoder] [--documents 64]

The model is served with ``task = "rerank"`` (the embedded default SmolLM2-135M unless
``--model``: any mlx-lm decoder scores the same way; a trained reranker only scores
better); ``--cross-encoder``: a BERT cross-encoder of the ms-marco MiniLM-L6 shape with
seeded weights. Prints JSON; docs/plugins/rerank.md records it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from mlx_lm import load

from mlxcore.testing.server import ServerPool
from mlxcore_rerank.cross_encoder import cross_pieces, pair_features
from mlxcore_rerank.loading import load_encoder_model
from mlxcore_rerank.scoring import Answers, pair_tokens, score_pieces
from mlxcore_rerank.testing import MINILM_L6, build_cross_encoder

WORDS = ["the", "a", "city", "river", "model", "data", "query", "answer", "paris", "france"]


def documents(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + "." for _ in range(n)]


def local_scorer(model_path: str) -> Callable[[str, list[str]], object]:
    """The same scoring in process, without the server: tokenize and run every pass."""
    cross = load_encoder_model(Path(model_path))
    if cross is not None:
        model, tokenizer = cross.model, cross.tokenizer

        def by_cross_encoder(query: str, docs: list[str]) -> object:
            features = [pair_features(tokenizer, query, d, model.max_tokens, 4096) for d in docs]
            return list(cross_pieces(model, features))

        return by_cross_encoder
    model, tokenizer = load(model_path)[:2]
    answers = Answers.of(tokenizer)

    def by_decoder(query: str, docs: list[str]) -> object:
        inputs = [pair_tokens(tokenizer, query, d) for d in docs]
        return list(score_pieces(model, inputs, answers))

    return by_decoder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--documents", type=int, default=64)
    parser.add_argument("--words", type=int, default=80)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cross-encoder", action="store_true")
    args = parser.parse_args(argv)
    from mlxcore.blas import reexec_with_openblas

    # the in-process side on the same BLAS as the server (which preloads OpenBLAS)
    reexec_with_openblas(sys.argv[1:], command=[sys.executable, __file__])
    from mlxcore.models.default import ensure_default_model

    query = "Which documents talk about the capital of France?"
    folder = Path(tempfile.mkdtemp(prefix="rerank-bench-"))
    if args.cross_encoder:
        model_path = str(build_cross_encoder(folder / "minilm", 0, shape=MINILM_L6))
    else:
        model_path = args.model or str(ensure_default_model())
    config = folder / "models.toml"
    config.write_text(f'[models.rerank]\nsource = "{model_path}"\ntask = "rerank"\n')
    pool = ServerPool(folder)
    report: dict[str, object] = {"documents": args.documents, "words": args.words}
    try:
        server = pool(model_path, "--served-model-name", "chat", "--models-config", str(config))
        scorer = local_scorer(model_path)
        http_rates, local_rates = [], []
        for r in range(args.rounds):
            docs = documents(args.documents, args.words, r)
            started = time.perf_counter()
            answer = httpx.post(
                f"{server.base_url}/v1/rerank",
                json={"model": "rerank", "query": query, "documents": docs},
                timeout=600,
            )
            answer.raise_for_status()
            http_rates.append(args.documents / (time.perf_counter() - started))
            report["tokens_per_request"] = answer.json()["usage"]["total_tokens"]
            started = time.perf_counter()
            scorer(query, docs)
            local_rates.append(args.documents / (time.perf_counter() - started))
        report["server_documents_per_s"] = round(statistics.median(http_rates), 1)
        report["in_process_documents_per_s"] = round(statistics.median(local_rates), 1)
        report["ratio"] = round(
            statistics.median(h / p for h, p in zip(http_rates, local_rates, strict=True)), 3
        )
    finally:
        pool.close()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
