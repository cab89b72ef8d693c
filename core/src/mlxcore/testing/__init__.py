"""Test helpers for mlxcore and its plugins: small real models and the pytest plugin.

>>> from mlxcore.testing import build_test_model
>>> path = build_test_model("qwen3_5")          # doctest: +SKIP
>>> model, tokenizer = mlx_lm.load(str(path))    # doctest: +SKIP

The pytest plugin (:mod:`mlxcore.testing.pytest_plugin`, registered through the
``pytest11`` entry point) offers the fixtures ``mlxcore_model_factory``, ``tiny_llama``,
``tiny_qwen3``, ``tiny_qwen3_5``, ``tiny_qwen3_5_moe`` and ``tiny_gemma4`` (``qwen3_moe``
and ``minimax`` through the factory).

Attributes are imported lazily so that importing this package (which pytest does in
every run) does not import mlx.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxcore.testing.model_specs import (
        BUILDER_VERSION,
        MODEL_SPECS,
        ModelSpec,
        TokenizerFamily,
        available_architectures,
        register_model_spec,
    )
    from mlxcore.testing.models import (
        build_test_model,
        default_test_models_root,
        model_cache_key,
        read_manifest,
    )
    from mlxcore.testing.runtime import make_runtime

_LAZY = {
    "BUILDER_VERSION": "mlxcore.testing.model_specs",
    "MODEL_SPECS": "mlxcore.testing.model_specs",
    "ModelSpec": "mlxcore.testing.model_specs",
    "TokenizerFamily": "mlxcore.testing.model_specs",
    "available_architectures": "mlxcore.testing.model_specs",
    "register_model_spec": "mlxcore.testing.model_specs",
    "build_test_model": "mlxcore.testing.models",
    "default_test_models_root": "mlxcore.testing.models",
    "model_cache_key": "mlxcore.testing.models",
    "read_manifest": "mlxcore.testing.models",
    "ParserConformance": "mlxcore.testing.conformance",
    "make_runtime": "mlxcore.testing.runtime",
}

__all__ = [
    "BUILDER_VERSION",
    "MODEL_SPECS",
    "ModelSpec",
    "TokenizerFamily",
    "available_architectures",
    "build_test_model",
    "default_test_models_root",
    "make_runtime",
    "model_cache_key",
    "read_manifest",
    "register_model_spec",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mlxcore.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
