"""Finding, converting and loading models.

* :func:`resolve_model` turns what the user typed (a folder, a Hugging Face repo id or a
  ``.gguf`` file) into a local MLX folder.
* :func:`load_model` loads that folder through mlx-lm and describes it as a
  :class:`~mlxcore.model_info.ModelInfo`.
* :func:`convert_gguf` converts a llama-family GGUF file into an MLX folder.
* :func:`ensure_default_model` provides the small built-in model (SmolLM2-135M-Instruct).

Every failure is raised as :class:`ModelLoadError`, whose message names the path or repo.
Heavy libraries (mlx-lm, transformers) are imported only when a function needs them.
"""

from __future__ import annotations

from mlxcore.errors import ModelLoadError
from mlxcore.models.default import ensure_default_model
from mlxcore.models.folder import read_weight_keys
from mlxcore.models.gguf import convert_gguf
from mlxcore.models.loader import LoadedModel, load_model
from mlxcore.models.resolve import (
    ResolvedModel,
    default_models_dir,
    mlxcore_home,
    resolve_model,
)

__all__ = [
    "LoadedModel",
    "ModelLoadError",
    "ResolvedModel",
    "convert_gguf",
    "default_models_dir",
    "ensure_default_model",
    "load_model",
    "mlxcore_home",
    "read_weight_keys",
    "resolve_model",
]
