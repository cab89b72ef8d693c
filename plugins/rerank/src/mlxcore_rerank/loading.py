"""A BERT checkpoint (a cross-encoder, or an embedding model) as a model the server
serves (its tokenizer wrapped as mlx-lm's, its :class:`~mlxcore.model_info.ModelInfo`
built as for any model)."""

from __future__ import annotations

import logging
from pathlib import Path

from mlxcore.errors import ModelLoadError
from mlxcore.models.folder import read_config
from mlxcore.models.loader import LoadedModel, describe_model
from mlxcore_rerank.cross_encoder import is_cross_encoder, load_cross_encoder
from mlxcore_rerank.encoder import is_encoder, load_encoder

log = logging.getLogger("mlxcore.plugins.rerank")


def load_encoder_model(path: Path, source: str = "") -> LoadedModel | None:
    """The cross-encoder or BERT embedding model in ``path``, or ``None`` when it holds
    another kind of model."""
    config = read_config(path)
    if is_cross_encoder(config):
        kind, load = "cross-encoder", load_cross_encoder
    elif is_encoder(config):
        kind, load = "embedding model", load_encoder
    else:
        return None
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from transformers import AutoTokenizer

    try:
        model = load(path, config)
        tokenizer = TokenizerWrapper(AutoTokenizer.from_pretrained(str(path)))
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise ModelLoadError(f"cannot load {kind} {path}: {reason}") from exc
    log.info("loaded %s %s (%s)", kind, source or path, config.get("model_type"))
    return LoadedModel(model, tokenizer, describe_model(path, config, tokenizer, source=source))
