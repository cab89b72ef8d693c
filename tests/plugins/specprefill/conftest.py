"""Fixtures for the specprefill tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mlx_lm import load


@pytest.fixture(scope="session")
def loaded(mlxcore_model_factory: Any) -> Any:
    """``loaded(arch, seed=0, **config_overrides)`` -> (model, tokenizer), memoised."""
    memo: dict[str, Any] = {}

    def get(arch: str, seed: int = 0, **overrides: Any) -> Any:
        key = json.dumps([arch, seed, overrides], sort_keys=True)
        if key not in memo:
            memo[key] = load(str(mlxcore_model_factory(arch, seed=seed, **overrides)))
        return memo[key]

    return get
