"""The draft model's own prefix reuse: a finished sequence's draft cache is stored, and a
sequence that starts with the same tokens prefills the draft only past them. Checked
through the real engine (an agent-like second turn: lossless greedy output, the draft
prefilled with the new tokens only, the stored keys equal to a fresh prefill's), the
store's bounds and eviction, and its bytes in the memory budget."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import make_runtime, reference_tokens, submit_together
from mlxcore_draft.prefixes import MIN_REUSE, DraftPrefixes, common_prefix

pytestmark = pytest.mark.xdist_group("draft")


def _layer(length: int, fill: float) -> KVCache:
    cache = KVCache()
    cache.keys = mx.full((1, 2, length, 4), fill)
    cache.values = mx.full((1, 2, length, 4), -fill)
    cache.offset = length
    return cache


def test_the_store_keeps_the_longest_prefix_bounded_and_untouched() -> None:
    per_token = 2 * 2 * 4 * 4  # keys and values, 2 heads x 4 dims, float32
    store = DraftPrefixes(max_bytes=100 * per_token)
    a = list(range(40))
    assert store.put(a, [_layer(40, 1.0)])
    assert not store.put(a[: MIN_REUSE - 1], [_layer(MIN_REUSE - 1, 2.0)])  # too short
    assert not store.put(list(range(200)), [_layer(200, 3.0)])  # larger than the store
    reused, layers = store.take([*a[:30], 999, 998])
    assert reused == 30 and layers is not None and layers[0].offset == 30
    layers[0].update_and_fetch(mx.zeros((1, 2, 1, 4)), mx.zeros((1, 2, 1, 4)))
    again, stored = store.take(a)  # the taken copy's write left the entry as it was
    assert again == 40 and stored is not None
    assert mx.array_equal(stored[0].keys, mx.full((1, 2, 40, 4), 1.0)).item()
    assert store.take([7, *a])[0] == 0  # no shared start
    b = [*a, *range(100, 120)]  # covers a: replaces it
    assert store.put(b, [_layer(60, 4.0)]) and len(store) == 1
    c = list(range(500, 560))  # both do not fit: the least recently used goes
    assert store.put(c, [_layer(60, 5.0)]) and len(store) == 1
    assert store.take(b)[0] == 0 and store.take(c)[0] == 60
    assert store.nbytes == 60 * per_token
    assert store.release(1) == 60 * per_token and store.nbytes == 0 and len(store) == 0
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 4])) == 2
    assert common_prefix(np.array([9]), np.array([1])) == 0


@pytest.fixture
def runtime(mlxcore_model_factory: Any) -> Iterator[Runtime]:
    target = mlxcore_model_factory("qwen3")
    draft = mlxcore_model_factory("qwen3", seed=1, num_hidden_layers=2)
    options = {"draft_model": str(draft), "draft_auto_off": False}
    rt = make_runtime(target, "draft", plugin_options=options)
    yield rt
    rt.engine.shutdown()


def test_a_second_turn_prefills_the_draft_past_the_first(runtime: Runtime) -> None:
    rng = random.Random(5)
    first = [rng.randrange(300, 3000) for _ in range(48)]
    (one,) = submit_together(runtime, [GenerationRequest(first, 12)])
    decoder = runtime.engine.decoder
    stats = decoder.stats()
    # the draft's context: the prompt (the joining sequence's last token, its first
    # output, is the pending one)
    assert stats["draft_prefix_entries"] == 1 and stats["draft_prefilled_tokens"] == 48
    assert runtime.engine.decoder.held_bytes() == stats["draft_prefix_bytes"] > 0
    second = [*first, *one.tokens, *(rng.randrange(300, 3000) for _ in range(9))]
    (two,) = submit_together(runtime, [GenerationRequest(second, 12)])
    assert two.tokens == reference_tokens(runtime, second, 12)  # still lossless
    stats = decoder.stats()
    assert stats["draft_prefix_hits"] == 1
    reused = stats["draft_prefix_reused_tokens"]
    assert reused >= len(first) + len(one.tokens) - 4  # all but the last round's drafts
    assert stats["draft_prefilled_tokens"] == 48 + (len(second) - reused)

    # what the store holds (the longest match is now the second turn's cache) is the
    # draft's own cache of those tokens: compared on the engine's thread, where the
    # stored arrays live
    def compare() -> int:
        held, layers = decoder.prefixes.take(second)
        assert held == len(second) and layers is not None
        fresh = make_prompt_cache(decoder.draft)
        decoder.draft(mx.array(second[:held])[None], cache=fresh)
        for stored, computed in zip(layers, fresh, strict=True):
            assert stored.offset == computed.offset == held
            assert mx.allclose(stored.keys, computed.keys[..., :held, :], atol=1e-5).item()
            assert mx.allclose(stored.values, computed.values[..., :held, :], atol=1e-5).item()
        return len(layers)

    assert runtime.engine.submit_job("check", compare, 1).future.result(timeout=60) == 2


def test_the_store_counts_in_the_memory_budget_and_gives_way(runtime: Runtime) -> None:
    prompt = [random.Random(8).randrange(300, 3000) for _ in range(40)]
    submit_together(runtime, [GenerationRequest(prompt, 8)])
    engine = runtime.engine
    held = engine.decoder.held_bytes()
    assert held > 0
    without = engine.memory.kv_budget(engine.cache.stats().nbytes)
    assert without is not None and without > held  # the budget is known and room enough
    assert engine.stats()["memory_kv_budget_bytes"] == without - held
    assert engine.decoder.release(1) == held and engine.decoder.held_bytes() == 0


def test_turned_off_and_recurrent_drafts_store_nothing(
    mlxcore_model_factory: Any, tiny_qwen3: Path, tiny_qwen3_5: Path
) -> None:
    draft = mlxcore_model_factory("qwen3", seed=1, num_hidden_layers=2)
    options = {"draft_model": str(draft), "draft_auto_off": False, "draft_prefix_cache_size": 0}
    rt = make_runtime(tiny_qwen3, "draft", plugin_options=options)
    try:
        submit_together(rt, [GenerationRequest(list(range(300, 340)), 8)])
        assert rt.engine.decoder.prefixes is None and rt.engine.decoder.held_bytes() == 0
        assert "draft_prefix_entries" not in rt.engine.decoder.stats()
    finally:
        rt.engine.shutdown()
    hybrid_draft = mlxcore_model_factory("qwen3_5", seed=1)
    options = {"draft_model": str(hybrid_draft), "draft_auto_off": False}
    rt = make_runtime(tiny_qwen3_5, "draft", plugin_options=options)
    try:  # a recurrent state cannot be cut back to a shorter prefix
        assert rt.engine.decoder.recurrent and rt.engine.decoder.prefixes is None
    finally:
        rt.engine.shutdown()
