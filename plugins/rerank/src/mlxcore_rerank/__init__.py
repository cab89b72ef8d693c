"""mlxcore plugin ``rerank``: ``/v1/rerank`` (Cohere/Jina shape, also ``/rerank`` and
``/v2/rerank``) and vLLM's ``/score`` (also ``/v1/score``) for models served as rerankers
(``task = "rerank"`` in a models file): a decoder model's yes/no answer to "does this
document meet the query?" (the Qwen3-Reranker recipe, :mod:`mlxcore_rerank.scoring`), or
a BERT cross-encoder's classifier (:mod:`mlxcore_rerank.cross_encoder`, which this plugin
also loads), computed by the engine as a job between decode steps, under the memory
budget. It also loads BERT embedding models for ``/v1/embeddings``
(:mod:`mlxcore_rerank.encoder`): mlx-embeddings' encoder, the same loader. See
docs/plugins/rerank.md.
"""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig
from mlxcore.models.loader import LoadedModel


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """The rerank and score routes."""
    from mlxcore_rerank.routes import rerank, score

    return [rerank, score]


@hookimpl
def mlxcore_load_model(model: Any, config: ServerConfig) -> LoadedModel | None:
    """Load BERT cross-encoders and embedding models; pass on every other model."""
    from mlxcore_rerank.loading import load_encoder_model

    return load_encoder_model(model.path, model.source)


@hookimpl
def mlxcore_model_architectures() -> list[str]:
    """The BERT checkpoints this plugin loads (cross-encoders, embedding models)."""
    from mlxcore_rerank.cross_encoder import ARCHITECTURES as CROSS_ENCODERS
    from mlxcore_rerank.encoder import ARCHITECTURES as ENCODERS

    return sorted(CROSS_ENCODERS | ENCODERS)
