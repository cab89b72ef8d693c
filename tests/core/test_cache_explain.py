"""Prefix-cache explanations: each miss class on real caches of real test models, the
counters by reason, and the response extension through the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.defaults.prefix_cache import LRUPrefixCache
from mlxcore.engine.cache_explain import explain_lookup
from mlxcore.engine.request import GenerationRequest
from mlxcore.models.loader import load_model
from mlxcore.testing.runtime import submit_together


def _filled(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array(tokens)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3: Path) -> Any:
    return load_model(tiny_qwen3).model


@pytest.fixture(scope="module")
def qwen3_5(tiny_qwen3_5: Path) -> Any:
    return load_model(tiny_qwen3_5).model


BASE = list(range(10, 110))  # 100 tokens


def test_trimmable_cache_explains_each_outcome(qwen3: Any) -> None:
    cache = LRUPrefixCache(qwen3, size="100000")
    first = cache.lookup([*BASE, 7])
    assert first.explanation is not None and first.explanation.reason == "no_entry"
    assert first.cached_tokens == 0

    cache.store(BASE, _filled(qwen3, BASE))
    follow = cache.lookup([*BASE, 1, 2, 3])
    assert follow.cached_tokens == 100
    assert follow.explanation is not None
    assert (follow.explanation.reason, follow.explanation.source) == ("new_suffix", "memory")
    assert follow.explanation.entry_tokens == 100

    changed = [*BASE[:60], 999, *BASE[61:]]
    diverged = cache.lookup(changed)
    assert diverged.cached_tokens == 60
    assert diverged.explanation is not None
    assert diverged.explanation.reason == "diverged"
    assert (diverged.explanation.diverged_at, diverged.explanation.entry_tokens) == (60, 100)

    same = cache.lookup(BASE)
    assert same.cached_tokens == 99
    assert same.explanation is not None and same.explanation.reason == "full"

    other = cache.lookup([3, 4, 5, 6])
    assert other.explanation is not None and other.explanation.reason == "no_entry"

    stats = cache.stats()
    assert stats.lookups["no_entry"] == 2 and stats.lookups["diverged"] == 1
    assert stats.lookups["new_suffix"] == 1 and stats.lookups["full"] == 1
    assert stats.hits == 3 and stats.misses == 2


def test_eviction_is_told_apart_from_a_plain_miss(qwen3: Any) -> None:
    cache = LRUPrefixCache(qwen3, size="150")  # room for one 100-token entry
    cache.store(BASE, _filled(qwen3, BASE))
    other = [5000 + i for i in range(100)]
    cache.store(other, _filled(qwen3, other))  # evicts BASE
    found = cache.lookup([*BASE, 1])
    assert found.cached_tokens == 0
    assert found.explanation is not None
    assert found.explanation.reason == "evicted"
    assert (found.explanation.entry_tokens, found.explanation.diverged_at) == (100, 100)


def test_recurrent_state_is_reused_only_at_a_boundary(qwen3_5: Any) -> None:
    cache = LRUPrefixCache(qwen3_5, size="100000")
    assert not cache.trimmable
    cache.store(BASE, _filled(qwen3_5, BASE))
    # shares 60 tokens with the stored entry, which cannot be rewound to 60
    found = cache.lookup([*BASE[:60], 999, 998, 997])
    assert found.cached_tokens == 0
    assert found.explanation is not None
    assert found.explanation.reason == "recurrent_boundary"
    assert found.explanation.diverged_at == 60
    extended = cache.lookup([*BASE, 1, 2])
    assert extended.cached_tokens == 100
    assert extended.explanation is not None and extended.explanation.reason == "new_suffix"


def test_a_disabled_cache_says_so(qwen3: Any) -> None:
    cache = LRUPrefixCache(qwen3, size="0")
    found = cache.lookup(BASE)
    assert found.explanation is not None and found.explanation.reason == "disabled"
    assert cache.stats().lookups["disabled"] == 1


def test_classification_rules() -> None:
    assert explain_lookup(10, 0, entry_tokens=0, shared=0, trimmable=True, source=None).reason == (
        "no_entry"
    )
    cut = explain_lookup(500, 200, entry_tokens=400, shared=200, trimmable=True, source="disk")
    assert (cut.reason, cut.source, cut.diverged_at) == ("diverged", "disk", 200)
    # an eviction only explains the miss when it would have covered more than what was found
    evicted = explain_lookup(
        500, 200, entry_tokens=200, shared=200, trimmable=True, source="memory",
        evicted_tokens=450, evicted_shared=450,
    )  # fmt: skip
    assert (evicted.reason, evicted.entry_tokens) == ("evicted", 450)
    assert "200/500 cached from memory" in evicted.summary()


def test_the_engine_reports_the_explanation_when_asked(runtime: Any, tiny_qwen3: Path) -> None:
    rt = runtime(tiny_qwen3, prefix_cache_size="10000")
    prompt = tuple(BASE)
    submit_together(rt, [GenerationRequest(prompt, 3)])
    asked = GenerationRequest(prompt[:70] + (999,) * 10, 3, options={"explain_cache": True})
    quiet = GenerationRequest(prompt[:70] + (998,) * 10, 3)
    told, untold = submit_together(rt, [asked]) + submit_together(rt, [quiet])
    assert told.finish is not None and untold.finish is not None
    explained = told.finish.usage.extra["mlxcore"]["cache"]
    assert explained["reason"] == "diverged" and explained["diverged_at"] == 70
    assert explained["cached_tokens"] == told.finish.usage.cached_tokens == 70
    assert "mlxcore" not in untold.finish.usage.extra
    stats = rt.engine.stats()
    assert stats["prefix_cache_lookups_diverged"] >= 2
