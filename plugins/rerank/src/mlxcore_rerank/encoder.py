"""BERT embedding models (``BertModel`` checkpoints such as all-MiniLM-L6-v2 and the BGE
embedders) on ``/v1/embeddings``: mlx-embeddings' BERT encoder over each text, pooled as
the checkpoint's sentence-transformers configuration says (``1_Pooling/config.json``:
the mean over the tokens, or the ``[CLS]`` state), L2-normalised, the first
``dimensions`` values kept (then normalised again). Texts run as padded forward passes
with an attention mask, the padding masked out of the attention and of the mean.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcore.embeddings import BATCH_TOKENS, batches, normalize

ARCHITECTURES = frozenset({"BertModel"})
"""The embedding checkpoints this module loads (``config.json``'s ``architectures``)."""


def is_encoder(config: dict[str, Any]) -> bool:
    """Whether ``config`` describes a BERT embedding checkpoint."""
    return bool(ARCHITECTURES.intersection(config.get("architectures") or ()))


def pooling_of(path: Path) -> str:
    """``cls`` when the checkpoint's sentence-transformers pooling takes the ``[CLS]``
    token, else ``mean``."""
    file = path / "1_Pooling" / "config.json"
    try:
        settings = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "mean"
    return "cls" if settings.get("pooling_mode_cls_token") else "mean"


class Encoder(nn.Module):
    """A BERT encoder whose pooled output is a text's embedding."""

    mlxcore_task = "embed"
    """What the server serves it for, whatever its models file says (it cannot chat)."""

    def __init__(self, config: dict[str, Any], pooling: str = "mean") -> None:
        from mlx_embeddings.models.bert import Model, ModelArgs

        super().__init__()
        self.args = ModelArgs.from_dict(config)
        self.model = Model(self.args)
        self.pooling = pooling

    def __call__(self, input_ids: mx.array, mask: mx.array) -> mx.array:
        """The pooled, not yet normalised, vector of each row (batch, tokens)."""
        hidden = self.model(input_ids, None, mask).last_hidden_state.astype(mx.float32)
        if self.pooling == "cls":
            return hidden[:, 0]
        weights = mask[:, :, None].astype(mx.float32)
        return (hidden * weights).sum(axis=1) / mx.maximum(weights.sum(axis=1), 1e-9)

    def mlxcore_embedding_pieces(
        self,
        inputs: Sequence[Sequence[int]],
        *,
        pooling: str = "last",
        dimensions: int | None = None,
        batch_tokens: int = BATCH_TOKENS,
    ) -> Generator[None, None, list[list[float]]]:
        """The embeddings of ``inputs`` (token ids each), in order, one padded forward
        pass per ``next`` (the engine's job; ``pooling`` is the checkpoint's own)."""
        out: list[list[float]] = [[] for _ in inputs]
        for indices in batches(inputs, batch_tokens):
            width = max(len(inputs[i]) for i in indices)
            ids = [list(inputs[i]) + [0] * (width - len(inputs[i])) for i in indices]
            mask = [[1] * len(inputs[i]) + [0] * (width - len(inputs[i])) for i in indices]
            vectors = normalize(self(mx.array(ids), mx.array(mask)), dimensions)
            rows: list[list[float]] = vectors.tolist()  # type: ignore[assignment]
            for i, row in zip(indices, rows, strict=True):
                out[i] = row
            yield
        return out


def load_encoder(path: Path, config: dict[str, Any]) -> Encoder:
    """The embedding checkpoint in ``path`` (Hugging Face names, with or without the
    ``bert.`` prefix)."""
    model = Encoder(config, pooling_of(path))
    weights: dict[str, mx.array] = {}
    for file in sorted(path.glob("*.safetensors")):
        weights.update(mx.load(str(file)))  # type: ignore[arg-type]
    named = {}
    for key, value in weights.items():
        if key.endswith("position_ids"):
            continue
        key = key.removeprefix("bert.")
        named[key if key.startswith("model.") else f"model.{key}"] = value
    model.load_weights(list(named.items()))
    model.eval()
    return model
