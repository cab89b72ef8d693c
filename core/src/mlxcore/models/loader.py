"""Load a model folder through mlx-lm as a :class:`LoadedModel`.

:func:`load_model` loads it with mlx-lm's own loader and builds its :class:`ModelInfo`
(the folder was checked by :mod:`mlxcore.models.folder` when it was resolved).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import attrs

from mlxcore.errors import ModelLoadError
from mlxcore.model_info import ModelInfo
from mlxcore.models.folder import read_weight_keys
from mlxcore.models.names import model_name
from mlxcore.models.resolve import ResolvedModel, resolve_model

logger = logging.getLogger(__name__)


@attrs.frozen
class LoadedModel:
    """A model ready to generate.

    Attributes:
        model: the mlx-lm model (an ``mlx.nn.Module``).
        tokenizer: mlx-lm's ``TokenizerWrapper``.
        info: what the core knows about the model.
        media: a :class:`mlxcore.media.MediaHandler` when the model reads images or
            video (set by the plugin that loaded it); ``None`` for text-only models.
    """

    model: Any
    tokenizer: Any
    info: ModelInfo
    media: Any = None


def load_model(
    model: ResolvedModel | str | os.PathLike[str],
    *,
    lazy: bool = False,
    tokenizer_config: dict[str, Any] | None = None,
    model_config: dict[str, Any] | None = None,
) -> LoadedModel:
    """Load ``model`` with mlx-lm's own loader and build its :class:`ModelInfo`.

    Args:
        model: a :class:`ResolvedModel`, or anything :func:`resolve_model` accepts.
        lazy: leave the weights unevaluated (mlx-lm's ``lazy``).
        tokenizer_config: extra tokenizer options for mlx-lm.
        model_config: config overrides for mlx-lm.

    Raises:
        ModelLoadError: naming the path when mlx-lm cannot load the model.
    """
    resolved = model if isinstance(model, ResolvedModel) else resolve_model(model)
    path = resolved.path
    from mlx_lm.utils import load as mlx_load

    try:
        mlx_model, tokenizer, config = mlx_load(  # type: ignore[misc]
            str(path),
            tokenizer_config=tokenizer_config,
            model_config=model_config,
            lazy=lazy,
            return_config=True,
        )
    except ModelLoadError:
        raise
    except Exception as exc:  # mlx-lm raises ValueError, RuntimeError, OSError, KeyError, ...
        raise ModelLoadError(f"cannot load model {path}: {type(exc).__name__}: {exc}") from exc
    info = describe_model(path, config, tokenizer, source=resolved.source)
    logger.info("loaded %s (%s)", model_name(str(resolved.source)), info.model_type)
    logger.debug("model folder: %s", path)
    return LoadedModel(model=mlx_model, tokenizer=tokenizer, info=info)


def describe_model(
    path: Path, config: dict[str, Any], tokenizer: Any, *, source: str = ""
) -> ModelInfo:
    """The :class:`ModelInfo` of a loaded model folder (``tokenizer``: mlx-lm's
    ``TokenizerWrapper``); plugins that load models themselves use it too."""
    return ModelInfo(
        path=path,
        model_type=str(config.get("model_type", "")),
        config=config,
        chat_template=_chat_template(tokenizer),
        vocab=dict(tokenizer.get_vocab()),
        eos_token_ids=frozenset(int(i) for i in (tokenizer.eos_token_ids or ())),
        source=source,
        weight_keys=read_weight_keys(path),
        tokenizer=tokenizer,
    )


def _chat_template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: use the default one
        template = template.get("default") or next(iter(template.values()), None)
    return template if isinstance(template, str) and template else None
