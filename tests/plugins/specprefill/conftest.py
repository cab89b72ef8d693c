"""Fixtures for the specprefill tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlx_lm import load
from sp_helpers import build_gpt_oss, build_nemotron_h, build_nemotron_h_moe


@pytest.fixture(scope="session")
def loaded(mlxcore_model_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``loaded(arch, seed=0, **config_overrides)`` -> (model, tokenizer), memoised.

    ``"gpt_oss"``, ``"nemotron_h"`` and ``"nemotron_h_moe"`` (no overrides) are built
    by the :mod:`sp_helpers` builders."""
    builders = {
        "gpt_oss": build_gpt_oss,
        "nemotron_h": build_nemotron_h,
        "nemotron_h_moe": build_nemotron_h_moe,
    }
    memo: dict[str, Any] = {}

    def get(arch: str, seed: int = 0, **overrides: Any) -> Any:
        key = json.dumps([arch, seed, overrides], sort_keys=True)
        if key not in memo:
            if arch in builders and not overrides:
                folder = tmp_path_factory.mktemp(f"{arch}_seed{seed}")
                path = builders[arch](folder, mlxcore_model_factory("llama"), seed=seed)
            else:
                path = mlxcore_model_factory(arch, seed=seed, **overrides)
            memo[key] = load(str(path))
        return memo[key]

    return get


@pytest.fixture(scope="session")
def gpt_oss_path(mlxcore_model_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny seeded GPT-OSS model folder (sliding-window layers, attention sinks)."""
    return build_gpt_oss(tmp_path_factory.mktemp("gpt_oss"), mlxcore_model_factory("llama"))


@pytest.fixture(scope="session")
def nemotron_h_path(mlxcore_model_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny seeded Nemotron-H model folder (Mamba-2, attention without RoPE, MLP)."""
    return build_nemotron_h(tmp_path_factory.mktemp("nemotron_h"), mlxcore_model_factory("llama"))
