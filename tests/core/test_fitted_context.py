"""The context a server keeps when no --max-model-len is given: the model's own, cut to
what one sequence's cache can hold in the memory left beside the weights (issue 59)."""

from __future__ import annotations

import logging
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcore.engine.memory import fitted_context
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.validation import RequestRejected, check_request
from mlxcore.testing.runtime import make_runtime


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
    tiny_qwen3: Path,
) -> None:
    before = mx.get_memory_limit()
    rt = make_runtime(tiny_qwen3, gpu_memory_utilization=0.003)
    try:
        engine = rt.engine
        fits = engine.memory.max_context()
        assert fits is not None and fits < 40960  # the model's own context
        assert engine.max_context == fits == engine.limits.context
        request = GenerationRequest(list(range(1, fits)), 8)
        with pytest.raises(RequestRejected) as refused:
            check_request(request, engine.limits)
        assert refused.value.code == "context_length_exceeded"
    finally:
        rt.engine.shutdown()
        mx.set_memory_limit(before)
