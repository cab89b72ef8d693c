"""Fixtures for the specprefill tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlx_lm import load
from sp_helpers import build_gpt_oss


@pytest.fixture(scope="session")
def loaded(mlxcore_model_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``loaded(arch, seed=0, **config_overrides)`` -> (model, tokenizer), memoised.

    ``"gpt_oss"`` (no overrides) is built by :func:`sp_helpers.build_gpt_oss`."""
    memo: dict[str, Any] = {}

    def get(arch: str, seed: int = 0, **overrides: Any) -> Any:
        key = json.dumps([arch, seed, overrides], sort_keys=True)
        if key not in memo:
            if arch == "gpt_oss" and not overrides:
                folder = tmp_path_factory.mktemp(f"gpt_oss_seed{seed}")
                path = build_gpt_oss(folder, mlxcore_model_factory("llama"), seed=seed)
            else:
                path = mlxcore_model_factory(arch, seed=seed, **overrides)
            memo[key] = load(str(path))
        return memo[key]

    return get


@pytest.fixture(scope="session")
def gpt_oss_path(mlxcore_model_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny seeded GPT-OSS model folder (sliding-window layers, attention sinks)."""
    return build_gpt_oss(tmp_path_factory.mktemp("gpt_oss"), mlxcore_model_factory("llama"))
