"""Embeddings from a decoder model's hidden states (mlx-lm models).

The model's transformer body (``model.model``: every layer and the final norm, without
the LM head) runs over the tokens; the embedding is pooled from its last hidden states:

* ``last`` (the default): the hidden state of the last token, as Qwen3-Embedding and
  other decoder embedding models are trained (the causal mask makes it depend on every
  token);
* ``mean``: the average over the tokens;

then L2-normalised. ``dimensions`` keeps the first N values and normalises again
(Matryoshka truncation). Texts are tokenized with the model's tokenizer as
``tokenizer.encode`` does (its own special tokens), without a chat template.

Many inputs run as one padded batch: inputs are sorted by length and cut into batches of
at most :data:`BATCH_TOKENS` padded tokens; padding goes after each input, where the
causal mask keeps it from changing the input's own hidden states.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any

import mlx.core as mx

BATCH_TOKENS = 8192
"""Most padded tokens in one forward pass."""


class EmbeddingError(ValueError):
    """The model cannot produce embeddings (no transformer body to call)."""


def body_of(model: Any) -> Any:
    """The transformer body of an mlx-lm model (hidden states after the final norm)."""
    body = getattr(model, "model", None)
    if body is None or not callable(body):
        raise EmbeddingError(f"{type(model).__name__} has no transformer body to embed with")
    return body


def hidden_size(model: Any) -> int:
    """Width of the embeddings ``model`` produces (before ``dimensions``)."""
    args = getattr(model, "args", None)
    size = getattr(args, "hidden_size", None)
    if not isinstance(size, int):
        text = getattr(args, "text_config", None)
        size = text.get("hidden_size") if isinstance(text, dict) else None
    if not isinstance(size, int):
        raise EmbeddingError(f"{type(model).__name__} does not say its hidden size")
    return size


def pool(hidden: mx.array, lengths: Sequence[int], pooling: str) -> mx.array:
    """One vector per row of ``hidden`` (batch, tokens, width), over its first
    ``lengths[i]`` tokens."""
    rows = []
    for i, n in enumerate(lengths):
        if pooling == "mean":
            rows.append(mx.mean(hidden[i, :n].astype(mx.float32), axis=0))
        else:
            rows.append(hidden[i, n - 1].astype(mx.float32))
    return mx.stack(rows)


def normalize(vectors: mx.array, dimensions: int | None = None) -> mx.array:
    """L2-normalise each row (after keeping its first ``dimensions`` values)."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    norms = mx.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / mx.maximum(norms, 1e-12)


def batches(inputs: Sequence[Sequence[int]], batch_tokens: int = BATCH_TOKENS) -> list[list[int]]:
    """The forward passes :func:`embed_tokens` makes: indices of ``inputs``, sorted by
    length and cut so that no pass holds more than ``batch_tokens`` padded tokens (one
    input alone may hold more)."""
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    out: list[list[int]] = []
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(inputs[order[end]]) * (end + 1 - start) <= batch_tokens:
            end += 1
        out.append(order[start:end])
        start = end
    return out


def forward_bytes(
    model: Any, inputs: Sequence[Sequence[int]], batch_tokens: int = BATCH_TOKENS
) -> int:
    """An upper estimate of the memory one call of :func:`embed_tokens` holds at once: the
    largest pass's float32 activations (hidden states, the MLP's expansion, the attention
    scores) and every result vector. What the engine's admission counts for the job."""
    args = getattr(model, "args", None)
    width = hidden_size(model)
    mlp = getattr(args, "intermediate_size", None)
    heads = getattr(args, "num_attention_heads", None)
    mlp = mlp if isinstance(mlp, int) else 4 * width
    heads = heads if isinstance(heads, int) else 1
    largest = 0
    for rows in batches(inputs, batch_tokens):
        length = max(len(inputs[i]) for i in rows)
        tokens = len(rows) * length
        largest = max(largest, tokens * (4 * width + 2 * mlp) + len(rows) * heads * length**2)
    return 4 * (largest + len(inputs) * width)


def embedding_pieces(
    model: Any,
    inputs: Sequence[Sequence[int]],
    *,
    pooling: str = "last",
    dimensions: int | None = None,
    batch_tokens: int = BATCH_TOKENS,
) -> Generator[None, None, list[list[float]]]:
    """:func:`embed_tokens` one forward pass at a time: yields after each batch, returns
    the embeddings (what the engine runs as a job, a batch per iteration)."""
    body = body_of(model)
    out: list[list[float]] = [[] for _ in inputs]
    for indices in batches(inputs, batch_tokens):
        batch = [list(inputs[i]) for i in indices]
        width = max(len(ids) for ids in batch)
        padded = mx.array([ids + [0] * (width - len(ids)) for ids in batch])
        hidden = body(padded)
        vectors = normalize(pool(hidden, [len(ids) for ids in batch], pooling), dimensions)
        rows: list[list[float]] = vectors.tolist()  # type: ignore[assignment]
        for i, row in zip(indices, rows, strict=True):
            out[i] = row
        yield
    return out


def embed_tokens(model: Any, inputs: Sequence[Sequence[int]], **options: Any) -> list[list[float]]:
    """Embeddings of ``inputs`` (token ids each, none empty), in their order, in one call
    (``options``: those of :func:`embedding_pieces`)."""
    pieces = embedding_pieces(model, inputs, **options)
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            result: list[list[float]] = done.value
            return result
