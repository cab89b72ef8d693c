"""BERT cross-encoders (``BertForSequenceClassification`` checkpoints such as the
ms-marco MiniLM rerankers): the query and the document go through the encoder together
as one sequence (``[CLS] query [SEP] document [SEP]``, segment ids 0 then 1) and the
classifier on the pooled ``[CLS]`` state gives the score: ``sigmoid(logit)`` for one
label (what sentence-transformers' ``CrossEncoder`` and vLLM report), the last label's
softmax probability for several.

The encoder is mlx-embeddings' BERT (``mlx_embeddings.models.bert``); the classifier, a
linear layer, is this module's. A Hugging Face checkpoint loads as it is (``bert.*`` and
``classifier.*`` tensors). Pairs run as padded forward passes with an attention mask,
a document cut to fit the model's positions (``only_second``, as the cross-encoders'
own tokenizers truncate).
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcore.embeddings import BATCH_TOKENS, batches, forward_bytes

ARCHITECTURES = frozenset({"BertForSequenceClassification"})
"""The checkpoints this module loads (``config.json``'s ``architectures``)."""


def is_cross_encoder(config: dict[str, Any]) -> bool:
    """Whether ``config`` (a ``config.json``) describes a checkpoint this module loads."""
    return bool(ARCHITECTURES.intersection(config.get("architectures") or ()))


def labels_of(config: dict[str, Any]) -> int:
    """How many labels the classifier has (``id2label``'s size, else ``num_labels``)."""
    names = config.get("id2label")
    if isinstance(names, dict) and names:
        return len(names)
    count = config.get("num_labels")
    return count if isinstance(count, int) and count > 0 else 2


class CrossEncoder(nn.Module):
    """A BERT encoder and a classifier on its pooled output."""

    mlxcore_task = "rerank"
    """What the server serves it for, whatever its models file says (it cannot chat)."""

    def __init__(self, config: dict[str, Any]) -> None:
        from mlx_embeddings.models.bert import Model, ModelArgs

        super().__init__()
        self.config = config
        self.args = ModelArgs.from_dict(config)
        """Its shape (``hidden_size``...), what the memory estimate reads."""
        self.bert = Model(self.args)
        self.classifier = nn.Linear(int(config["hidden_size"]), labels_of(config))

    def __call__(self, input_ids: mx.array, token_type_ids: mx.array, mask: mx.array) -> mx.array:
        """Relevance scores in (0, 1), one per row of ``input_ids`` (batch, tokens)."""
        pooled = self.bert(input_ids, token_type_ids, mask).pooler_output
        logits = self.classifier(pooled).astype(mx.float32)
        if logits.shape[-1] == 1:
            return mx.sigmoid(logits[:, 0])
        return mx.softmax(logits, axis=-1)[:, -1]

    @property
    def max_tokens(self) -> int:
        """The most tokens one pair may have (the model's positions)."""
        return int(self.config.get("max_position_embeddings", 512))


def load_cross_encoder(path: Path, config: dict[str, Any]) -> CrossEncoder:
    """The checkpoint in ``path`` (its safetensors files, Hugging Face names)."""
    model = CrossEncoder(config)
    weights: dict[str, mx.array] = {}
    for file in sorted(path.glob("*.safetensors")):
        weights.update(mx.load(str(file)))  # type: ignore[arg-type]
    weights = {k: v for k, v in weights.items() if not k.endswith("position_ids")}
    model.load_weights(list(weights.items()))
    model.eval()
    return model


def pair_features(
    tokenizer: Any, query: str, document: str, max_tokens: int, max_document_tokens: int | None
) -> tuple[list[int], list[int]]:
    """The token ids and segment ids of one pair, the document cut to fit ``max_tokens``
    (and to ``max_document_tokens``)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's wrapper or the tokenizer
    if max_document_tokens is not None:
        ids = hf.encode(document, add_special_tokens=False)
        if len(ids) > max_document_tokens:
            document = hf.decode(ids[:max_document_tokens])
    encoded = hf(
        query,
        document,
        truncation="only_second",
        max_length=max_tokens,
        return_token_type_ids=True,
    )
    types = encoded.get("token_type_ids") or [0] * len(encoded["input_ids"])
    return list(encoded["input_ids"]), list(types)


def cross_bytes(model: CrossEncoder, inputs: Sequence[tuple[list[int], list[int]]]) -> int:
    """An upper estimate of the memory :func:`cross_pieces` holds at once (the
    embeddings' estimate: the largest pass's activations and attention scores)."""
    return forward_bytes(model, [ids for ids, _ in inputs])


def cross_pieces(
    model: CrossEncoder,
    inputs: Sequence[tuple[list[int], list[int]]],
    batch_tokens: int = BATCH_TOKENS,
) -> Generator[None, None, list[float]]:
    """The scores of ``inputs`` (token and segment ids per pair), in order, one padded
    forward pass per ``next`` (what the engine runs as a job)."""
    out = [0.0] * len(inputs)
    for indices in batches([ids for ids, _ in inputs], batch_tokens):
        width = max(len(inputs[i][0]) for i in indices)
        ids = [inputs[i][0] + [0] * (width - len(inputs[i][0])) for i in indices]
        types = [inputs[i][1] + [0] * (width - len(inputs[i][1])) for i in indices]
        mask = [[1] * len(inputs[i][0]) + [0] * (width - len(inputs[i][0])) for i in indices]
        scores = model(mx.array(ids), mx.array(types), mx.array(mask, dtype=mx.float32))
        values: list[float] = scores.tolist()  # type: ignore[assignment]
        for i, value in zip(indices, values, strict=True):
            out[i] = value
        yield
    return out
