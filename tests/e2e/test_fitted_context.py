"""The context a server keeps when no --max-model-len is given: the model's own, cut to
what one sequence's cache can hold in the memory left beside the weights (issue 59)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxcore.engine.memory import fitted_context


def test_the_model_context_is_cut_to_what_fits(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="mlxcore.engine.memory"):
        assert fitted_context(None, 40960, 34472) == 34472
    assert "34472 tokens, what fits in memory" in caplog.text
    assert fitted_context(None, 40960, 1_000_000) == 40960
    assert fitted_context(None, None, 5000) == 5000
    assert fitted_context(None, 40960, None) == 40960


def test_an_explicit_length_is_kept_with_a_warning_when_memory_holds_less(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="mlxcore.engine.memory"):
        assert fitted_context(8192, 40960, 4096) == 8192
    assert any(r.levelno == logging.WARNING and "4096" in r.getMessage() for r in caplog.records)


def test_a_small_memory_budget_derives_the_context_and_refuses_beyond_it(
    tiny_qwen3: Path, mlxcore_server: Any
) -> None:
    """A fresh server (its own process: the budget counts all of MLX's memory) whose
    memory limit holds less than the model's 40,960 tokens of context."""
    server = mlxcore_server(tiny_qwen3, "--gpu-memory-utilization", "0.003", "--log-level", "info")
    context = httpx.get(f"{server.v1}/models", timeout=10).json()["data"][0]["context_length"]
    assert 1000 < context < 40960
    assert f"context: {context} tokens, what fits in memory" in server.log()
    name = httpx.get(f"{server.v1}/models", timeout=10).json()["data"][0]["id"]
    refused = httpx.post(
        f"{server.v1}/completions",
        json={"model": name, "prompt": [100] * (context + 10), "max_tokens": 1},
        timeout=60,
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
