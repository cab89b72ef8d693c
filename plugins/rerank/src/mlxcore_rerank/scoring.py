"""Relevance scores from a decoder model's yes/no answer (the Qwen3-Reranker recipe).

A query and one document become one chat turn: a system message asking whether the
document meets the query's need (answer "yes" or "no"), a user message holding the task
instruction, the query and the document, then the assistant's turn with thinking turned
off (``enable_thinking=False``: for Qwen3 templates the empty think block Qwen3-Reranker
was trained with). The score is the probability of "yes" against "no" at the last
position: ``softmax([logit_no, logit_yes])[1]``, that is ``sigmoid(yes - no)``. A model
without a chat template gets the same texts joined by blank lines.

Many pairs run as padded forward passes as embeddings do (:mod:`mlxcore.embeddings`:
sorted by length, padding after each pair where the causal mask hides it); only the last
position of each pair goes through the language-model head.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import attrs
import mlx.core as mx

from mlxcore.embeddings import BATCH_TOKENS, batches, body_of, forward_bytes

SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
"""The system message Qwen3-Reranker was trained with."""

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
"""The task instruction when a request gives none (Qwen3-Reranker's default)."""


class RerankError(ValueError):
    """The model cannot score pairs (no yes/no tokens, no head to read them with)."""


@attrs.frozen
class Answers:
    """The token ids of the two answers whose logits make a score."""

    yes: int
    no: int

    @classmethod
    def of(cls, tokenizer: Any) -> Answers:
        """The ``yes`` and ``no`` tokens of ``tokenizer`` (each a single token)."""
        return cls(_single_token(tokenizer, "yes"), _single_token(tokenizer, "no"))


def _single_token(tokenizer: Any, word: str) -> int:
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is not None:
        found = convert(word)
        unknown = getattr(tokenizer, "unk_token_id", None)
        if isinstance(found, int) and found >= 0 and found != unknown:
            return found
    ids = list(tokenizer.encode(word, add_special_tokens=False))
    if len(ids) != 1:
        raise RerankError(f"the model's tokenizer has no single token for {word!r}")
    return int(ids[0])


def pair_text(tokenizer: Any, query: str, document: str, instruction: str | None) -> str:
    """The prompt that asks whether ``document`` answers ``query``."""
    user = (
        f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n"
        f"<Query>: {query}\n<Document>: {document}"
    )
    if not getattr(tokenizer, "chat_template", None):
        return f"{SYSTEM}\n\n{user}\n\n"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    text: str = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    return text


def truncated(tokenizer: Any, text: str, max_tokens: int | None) -> str:
    """``text`` cut to its first ``max_tokens`` tokens (as Cohere's
    ``max_tokens_per_doc`` does), unchanged when it is shorter."""
    if max_tokens is None:
        return text
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if len(ids) <= max_tokens:
        return text
    cut: str = tokenizer.decode(ids[:max_tokens])
    return cut


def pair_tokens(
    tokenizer: Any,
    query: str,
    document: str,
    instruction: str | None = None,
    max_document_tokens: int | None = None,
) -> list[int]:
    """The token ids of one pair's prompt (its document first cut to
    ``max_document_tokens``)."""
    document = truncated(tokenizer, document, max_document_tokens)
    text = pair_text(tokenizer, query, document, instruction)
    return list(tokenizer.encode(text, add_special_tokens=False))


def head_logits(model: Any, hidden: mx.array) -> mx.array:
    """The language-model head of an mlx-lm model on ``hidden`` (rows, width): its own
    ``lm_head``, or the tied input embeddings."""
    head = getattr(model, "lm_head", None)
    if head is not None:
        return head(hidden)
    embed = getattr(body_of(model), "embed_tokens", None)
    if embed is None or not hasattr(embed, "as_linear"):
        raise RerankError(f"{type(model).__name__} has no language-model head to score with")
    out: mx.array = embed.as_linear(hidden)
    return out


def vocabulary(model: Any) -> int:
    """How many logits the head makes (for the memory estimate)."""
    size = getattr(getattr(model, "args", None), "vocab_size", None)
    return size if isinstance(size, int) else 0


def score_bytes(
    model: Any, inputs: Sequence[Sequence[int]], batch_tokens: int = BATCH_TOKENS
) -> int:
    """An upper estimate of the memory :func:`score_pieces` holds at once: the largest
    forward pass (as for embeddings) and the head's float32 logits of the most pairs one
    pass holds."""
    rows = max((len(indices) for indices in batches(inputs, batch_tokens)), default=0)
    return forward_bytes(model, inputs, batch_tokens) + 4 * rows * vocabulary(model)


def score_pieces(
    model: Any,
    inputs: Sequence[Sequence[int]],
    answers: Answers,
    batch_tokens: int = BATCH_TOKENS,
) -> Generator[None, None, list[float]]:
    """The scores of ``inputs`` (each a pair's token ids, none empty), in order, one
    forward pass per ``next`` (what the engine runs as a job)."""
    body = body_of(model)
    out = [0.0] * len(inputs)
    for indices in batches(inputs, batch_tokens):
        rows = [list(inputs[i]) for i in indices]
        width = max(len(ids) for ids in rows)
        padded = mx.array([ids + [0] * (width - len(ids)) for ids in rows])
        hidden = body(padded)
        last = hidden[mx.arange(len(rows)), mx.array([len(ids) - 1 for ids in rows])]
        logits = head_logits(model, last).astype(mx.float32)
        scores = mx.sigmoid(logits[:, answers.yes] - logits[:, answers.no])
        values: list[float] = scores.tolist()  # type: ignore[assignment]
        for i, value in zip(indices, values, strict=True):
            out[i] = value
        yield
    return out
