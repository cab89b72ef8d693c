"""The decoder reranker's scores, in process: the Qwen3-Reranker prompt, and batched
padded forward passes equal to each pair's own full forward pass (mlx-lm's model call,
softmax over the no/yes logits) within 1e-5, on two architectures."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load

from mlxcore.embeddings import batches
from mlxcore_rerank.scoring import (
    DEFAULT_INSTRUCTION,
    SYSTEM,
    Answers,
    pair_tokens,
    score_pieces,
)
from mlxcore_rerank.testing import run_pieces

QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "The mitochondria is the powerhouse of the cell.",
    "",
    "Lyon is a city in France. " * 12,
    "Berlin is the capital of Germany; Paris that of France.",
]


def reference(model, ids: list[int], answers: Answers) -> float:  # type: ignore[no-untyped-def]
    """One pair alone, through the model's own call: P(yes) among {no, yes}."""
    logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
    pair = mx.softmax(mx.stack([logits[answers.no], logits[answers.yes]]))
    return float(pair[1].item())


def test_the_prompt_is_qwen3_rerankers(tiny_qwen3: Path) -> None:
    _, tokenizer = load(str(tiny_qwen3))
    expected = (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"<Instruct>: {DEFAULT_INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {DOCUMENTS[0]}"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert pair_tokens(tokenizer, QUERY, DOCUMENTS[0]) == tokenizer.encode(
        expected, add_special_tokens=False
    )
    answers = Answers.of(tokenizer)
    assert tokenizer.decode([answers.yes]) == "yes" and tokenizer.decode([answers.no]) == "no"


def test_a_document_is_cut_to_max_document_tokens(tiny_qwen3: Path) -> None:
    _, tokenizer = load(str(tiny_qwen3))
    long = pair_tokens(tokenizer, QUERY, DOCUMENTS[3])
    short = pair_tokens(tokenizer, QUERY, DOCUMENTS[3], max_document_tokens=5)
    whole = len(tokenizer.encode(DOCUMENTS[3], add_special_tokens=False))
    assert len(long) - len(short) == whole - 5


@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_llama"])
def test_batched_scores_equal_each_pair_alone(fixture: str, request: pytest.FixtureRequest) -> None:
    model, tokenizer = load(str(request.getfixturevalue(fixture)))
    answers = Answers.of(tokenizer)
    inputs = [pair_tokens(tokenizer, QUERY, d, "Find the answer") for d in DOCUMENTS]
    want = [reference(model, ids, answers) for ids in inputs]
    # one padded pass for all, and several smaller ones: the same scores
    for budget in (8192, 2 * max(len(ids) for ids in inputs)):
        assert (len(batches(inputs, budget)) > 1) == (budget != 8192)
        got = run_pieces(score_pieces(model, inputs, answers, budget))
        assert got == pytest.approx(want, abs=1e-5)
    assert all(0.0 < s < 1.0 for s in want) and len(set(want)) == len(want)
