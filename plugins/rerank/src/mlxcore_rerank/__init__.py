"""mlxcore plugin ``rerank``: ``/v1/rerank`` (Cohere/Jina shape, also ``/rerank`` and
``/v2/rerank``) and vLLM's ``/score`` (also ``/v1/score``) for models served as rerankers
(``task = "rerank"`` in a models file): a decoder model's yes/no answer to "does this
document meet the query?" (the Qwen3-Reranker recipe, :mod:`mlxcore_rerank.scoring`),
computed by the engine as a job between decode steps, under the memory budget. See
docs/plugins/rerank.md.
"""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.config import ServerConfig


@hookimpl
def mlxcore_routes(config: ServerConfig) -> list[Any]:
    """The rerank and score routes."""
    from mlxcore_rerank.routes import rerank, score

    return [rerank, score]
