"""The draft and SpecPrefill plugins load their second model once per model load
(``mlxcore_model_resources``): an engine restart and a failed decode step build new
strategies around the same draft. Counted at the one function both plugins load with."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mlxcore.models.drafts as drafts
from mlxcore.engine.events import UNAVAILABLE, FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import make_runtime, reference_tokens

pytestmark = pytest.mark.xdist_group("draft")

PROMPT = tuple(range(300, 340))


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every draft load in this test, by source (the real loader still runs)."""
    seen: list[str] = []
    real = drafts.load_draft

    def counted(source: str, target: Any, flag: str) -> Any:
        seen.append(flag)
        return real(source, target, flag)

    monkeypatch.setattr(drafts, "load_draft", counted)
    yield seen


def run(rt: Runtime, max_tokens: int = 8, **options: Any) -> tuple[list[int], FinishEvent]:
    tokens: list[int] = []
    for event in rt.engine.stream(GenerationRequest(PROMPT, max_tokens, options=options)):
        if isinstance(event, TokenEvent):
            tokens.extend(t.token for t in event.tokens)
        else:
            return tokens, event
    raise AssertionError("no finish event")


def restart_by_watchdog(rt: Runtime, fault: str) -> None:
    """A hung step: the watchdog abandons it and the engine restarts with new strategies."""
    _, finish = run(rt, fault=fault)
    assert finish.code == UNAVAILABLE, finish
    assert rt.engine.stats()["engine_restarts"] == 1
    time.sleep(2.1)  # the restart back-off


def test_the_draft_model_loads_once_across_restarts_and_failed_steps(
    tiny_qwen3: Path, loads: list[str]
) -> None:
    rt = make_runtime(
        tiny_qwen3,
        "draft",
        "failing_draft_step",
        "mlxcore.testing.faults",
        plugin_options={"draft_model": str(tiny_qwen3), "draft_auto_off": False},
        decoder="failing-draft",
        engine_watchdog=1.0,
    )
    try:
        draft = rt.engine.decoder.draft  # type: ignore[attr-defined]
        assert loads == ["--draft-model"]
        first = rt.engine.decoder
        _, finish = run(rt, fail_step=True)
        assert finish.reason == "error" and rt.engine.stats()["decode_step_failures"] == 1
        assert rt.engine.decoder is not first and rt.engine.decoder.draft is draft  # type: ignore[attr-defined]
        restart_by_watchdog(rt, "prefill:hang")
        assert rt.engine.decoder.draft is draft  # type: ignore[attr-defined]
        tokens, finish = run(rt)
        assert finish.reason == "length" and tokens == reference_tokens(rt, PROMPT, 8)
        assert loads == ["--draft-model"]
    finally:
        rt.engine.shutdown(timeout=5)


def test_the_specprefill_draft_loads_once_across_restarts_and_failed_steps(
    mlxcore_model_factory: Any, loads: list[str]
) -> None:
    rt = make_runtime(
        mlxcore_model_factory("llama"),
        "specprefill",
        "mlxcore.testing.faults",
        plugin_options={
            "specprefill_draft_model": str(mlxcore_model_factory("llama", seed=1)),
            "specprefill_threshold": 16,
        },
        prefill_strategy="specprefill",
        engine_watchdog=1.0,
    )
    try:
        draft = rt.engine.prefill.draft  # type: ignore[attr-defined]
        assert loads == ["--specprefill-draft-model"]
        _, finish = run(rt, fault="decoder:raise")
        assert finish.reason == "error" and rt.engine.stats()["decode_step_failures"] == 1
        restart_by_watchdog(rt, "decoder:hang")
        assert rt.engine.prefill.draft is draft  # type: ignore[attr-defined]
        tokens, finish = run(rt)
        assert finish.reason == "length" and len(tokens) == 8
        assert rt.engine.stats()["prefill_specprefill_applications"] == 1
        assert loads == ["--specprefill-draft-model"]
    finally:
        rt.engine.shutdown(timeout=5)
