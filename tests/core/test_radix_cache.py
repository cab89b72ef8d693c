"""The built-in radix prefix cache on real caches of real test models (hybrid Qwen3.5 and
dense Qwen3): a prompt resumes from the deepest snapshot before it leaves a stored one,
the state it resumes from is exactly the cold state (logits and greedy tokens, alone and
batched), shared prefixes are held once, and eviction under a tight budget never hands
out a wrong prefix."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, make_prompt_cache

from mlxcore.defaults.prefix_cache import LRUPrefixCache
from mlxcore.defaults.radix_cache import RadixPrefixCache, prefix_cache_for
from mlxcore.engine.cache_segments import ARRAY_OVERHEAD_BYTES
from mlxcore.engine.memory import cache_cost
from mlxcore.engine.prefill_plan import common_prefix
from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import MlxcoreError
from mlxcore.models.loader import load_model
from mlxcore.prompts import render_chat
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import assert_matches_mlx_lm, submit_together

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a file in the workspace; " + "details " * 40,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read", "write", "edit", "grep", "glob", "bash")
]
SYSTEM = "You are a coding agent working in a repository. " * 40


def chat(user: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


@pytest.fixture(scope="module")
def models(tiny_qwen3: Path, tiny_qwen3_5: Path) -> dict[str, Any]:
    return {"dense": load_model(tiny_qwen3).model, "hybrid": load_model(tiny_qwen3_5).model}


def filled(model: Any, tokens: list[int], stops: list[int], cache_strategy: Any) -> None:
    """Prefill ``tokens`` the way the engine does: stop at ``stops`` and offer snapshots
    there, then offer the whole."""
    cache = make_prompt_cache(model)
    done = 0
    for stop in [*stops, len(tokens)]:
        model(mx.array(tokens[done:stop])[None], cache=cache)
        mx.eval([c.state for c in cache])
        done = stop
        cache_strategy.store_checkpoint(tokens[:stop], cache)


def cold_logits(model: Any, tokens: list[int]) -> mx.array:
    return model(mx.array(tokens)[None], cache=make_prompt_cache(model))[:, -1, :]


def resumed_logits(model: Any, tokens: list[int], strategy: Any) -> tuple[mx.array, int]:
    found = strategy.lookup(tokens)
    logits = model(mx.array(tokens[found.cached_tokens :])[None], cache=found.cache)
    return logits[:, -1, :], found.cached_tokens


def test_the_radix_tree_serves_models_it_can_cut(models: dict[str, Any], tiny_gemma4: Path):
    assert isinstance(prefix_cache_for(models["dense"], "1000"), RadixPrefixCache)
    assert isinstance(prefix_cache_for(models["hybrid"], "1000"), RadixPrefixCache)
    gemma = load_model(tiny_gemma4).model  # sliding-window layers: whole entries
    assert isinstance(prefix_cache_for(gemma, "1000"), LRUPrefixCache)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_a_prompt_resumes_where_it_leaves_a_stored_one_with_the_cold_state(
    kind: str, models: dict[str, Any]
) -> None:
    model = models[kind]
    cache = RadixPrefixCache(model, "100000")
    rng = random.Random(3)
    first = [rng.randrange(100, 5000) for _ in range(700)]
    request = GenerationRequest(tuple(first), boundaries=(270, 540))
    stops = cache.snapshot_points(request, 0)
    assert stops == ([270, 540] if kind == "hybrid" else [])
    filled(model, first, stops, cache)
    side = [*first[:560], *(rng.randrange(100, 5000) for _ in range(50))]
    logits, cached = resumed_logits(model, side, cache)
    assert cached == (540 if kind == "hybrid" else 560)
    assert mx.allclose(logits, cold_logits(model, side), atol=1e-5).item()
    found = cache.lookup(side)
    assert found.explanation is not None
    assert found.explanation.reason == ("snapshot" if kind == "hybrid" else "diverged")
    assert found.explanation.diverged_at == 560
    if kind == "hybrid":
        assert "resumed at token 540 of a shared 560" in found.explanation.summary()


def test_snapshot_points_keep_a_gap_and_fall_on_multiples_of_the_interval(
    models: dict[str, Any],
) -> None:
    cache = RadixPrefixCache(models["hybrid"], "100000")
    assert cache.gap >= 256 and cache.interval % 2048 == 0 and cache.interval >= 4 * cache.gap
    length = 3 * cache.interval + 100
    boundaries = (10, 200, 300, 350, cache.interval - 5, cache.interval + 700, length - 1)
    request = GenerationRequest(tuple(range(length)), boundaries=boundaries)
    points = cache.snapshot_points(request, 0)
    interval = cache.interval
    assert points == [300, interval, interval + 700, 2 * interval, 3 * interval]
    assert cache.snapshot_points(request, 2 * interval) == [3 * interval]
    dense = RadixPrefixCache(models["dense"], "100000")
    assert dense.snapshot_points(request, 0) == []


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_eviction_under_a_tight_budget_never_serves_a_wrong_prefix(
    kind: str, models: dict[str, Any]
) -> None:
    """Random prompts over a few shared stems, stored with snapshots, under a budget of a
    few hundred tokens: every lookup's state gives the cold logits for the rest."""
    model = models[kind]
    per_token, fixed = cache_cost(model)
    cache = RadixPrefixCache(model, f"{per_token * 400 + fixed * 3}b")
    rng = random.Random(11)
    stems = [[rng.randrange(100, 5000) for _ in range(300)] for _ in range(3)]
    hits = 0
    for _ in range(24):
        stem = rng.choice(stems)
        prompt = stem[: rng.randrange(20, 300)] + [
            rng.randrange(100, 5000) for _ in range(rng.randrange(1, 60))
        ]
        logits, cached = resumed_logits(model, prompt, cache)
        # a wrong prefix moves the logits by ~0.1-1; resuming a recurrent state at another
        # chunk boundary moves them by ~1e-5 (float32 rounding of the scan, OpenBLAS)
        assert mx.allclose(logits, cold_logits(model, prompt), atol=1e-4).item(), cached
        hits += cached > 0
        stops = sorted({s for s in (rng.randrange(1, len(prompt)), len(prompt) // 2) if s > 0})
        filled(model, prompt, stops, cache)
        stats = cache.stats()
        assert stats.nbytes <= cache.max_bytes
        assert stats.nbytes == sum(n.nbytes for n in cache.tree)
    assert hits >= 8


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_qwen3_5", "tiny_gemma4"])
def test_side_requests_resume_at_their_message_and_decode_like_cold_alone_and_batched(
    family: str, request: pytest.FixtureRequest, runtime: Callable[..., Runtime]
) -> None:
    rt = runtime(request.getfixturevalue(family), prefix_cache_size="100000")

    def chat_request(user: str, n: int = 6) -> GenerationRequest:
        rendered = render_chat(rt.tokenizer, chat(user), tools=TOOLS)
        return GenerationRequest(
            tuple(rendered.ids), n, checkpoints=rendered.checkpoints(),
            boundaries=rendered.boundaries,
        )  # fmt: skip

    main = chat_request("Fix the failing test in tests/test_parser.py, please.")
    (first,) = submit_together(rt, [main])
    assert_matches_mlx_lm(rt, main, first)
    side = chat_request("Write a 5-10 word title for this conversation.")
    shared = common_prefix(main.prompt_tokens, side.prompt_tokens)
    (alone,) = submit_together(rt, [side])
    assert_matches_mlx_lm(rt, side, alone)
    assert alone.finish is not None
    assert alone.finish.usage.cached_tokens >= 0.9 * shared
    batch = [chat_request(f"Sub-agent {i}: list the files under src/{i}.") for i in range(4)]
    results = submit_together(rt, batch)
    for req, res in zip(batch, results, strict=True):
        assert_matches_mlx_lm(rt, req, res)
        assert res.finish is not None and res.finish.usage.cached_tokens >= 0.9 * shared
    stats = rt.engine.stats()  # a hybrid's snapshot at the message start is where they part
    if family != "tiny_gemma4":  # gemma4: a whole entry kept where the first message starts
        assert stats["prefix_cache_lookups_diverged"] + stats["prefix_cache_lookups_snapshot"] == 5


def test_sessions_sharing_a_system_prompt_hold_it_once(
    models: dict[str, Any], tiny_qwen3_5: Path, runtime: Callable[..., Runtime]
) -> None:
    """Sixteen sessions on one 2,000-token system prompt: the cache holds the prompt once
    plus each session's own tokens and snapshots, not sixteen prompts."""
    rt = runtime(tiny_qwen3_5, prefix_cache_size="200000")
    rng = random.Random(5)
    system = [rng.randrange(100, 5000) for _ in range(2000)]
    requests = [
        GenerationRequest(
            tuple(system + [rng.randrange(100, 5000) for _ in range(40)]),
            4,
            boundaries=(len(system),),
        )
        for _ in range(16)
    ]
    for req in requests:
        submit_together(rt, [req])
    stats = rt.engine.stats()
    per_token, fixed = cache_cost(rt.model)
    unique = sum(len(r.prompt_tokens) - len(system) + r.max_tokens for r in requests)
    snapshots = stats["prefix_cache_snapshots"]
    # every node holds a key and a value array per attention layer, each with its fixed cost
    attention = sum(1 for layer in make_prompt_cache(rt.model) if isinstance(layer, KVCache))
    arrays = stats["prefix_cache_nodes"] * attention * 2 * ARRAY_OVERHEAD_BYTES
    expected = (len(system) + unique) * per_token + snapshots * fixed + arrays
    assert stats["prefix_cache_bytes"] <= expected
    assert stats["prefix_cache_bytes"] < 2 * len(system) * per_token + snapshots * fixed + arrays
    # one snapshot at the prompt's end shared by all, one at each session's end
    assert snapshots <= 2 + 16
    assert stats["prefix_cache_hits"] == 15


def test_a_rank_holding_only_recurrent_layers_takes_rank_zeros_snapshot_spacing(
    models: dict[str, Any],
) -> None:
    """Pipeline parallel: a rank whose layers are all recurrent still keeps a tree (of
    snapshots only), and adopts rank 0's spacing so both take snapshots at the same points;
    a cache strategy of another kind refuses the settings."""
    hybrid = models["hybrid"]
    leader = RadixPrefixCache(hybrid, "100000")
    layout = leader.layout
    recurrent_only = type(layout)(
        [k for k in layout.kinds if k == "state"],
        [t for t, k in zip(layout.state_types, layout.kinds, strict=True) if k == "state"],
    )
    follower = RadixPrefixCache(hybrid, "100000", layout=recurrent_only)
    follower.adopt_settings(leader.shared_settings())
    request = GenerationRequest(tuple(range(6000)), boundaries=(300, 2500))
    assert follower.snapshot_points(request, 0) == leader.snapshot_points(request, 0)
    with pytest.raises(MlxcoreError, match="different cache strategies"):
        LRUPrefixCache(hybrid, "1000").adopt_settings(leader.shared_settings())


def test_a_whole_entry_that_serves_lookups_outlives_newer_unused_ones(
    models: dict[str, Any],
) -> None:
    """mlx-lm's LRU of whole entries (64 at most) ordered them by insertion only: the
    entry every side request resumed from aged out. A hit now counts as a use."""
    model = models["hybrid"]  # recurrent state: an entry is used only as an exact prefix
    cache = LRUPrefixCache(model, "1GB")
    system = list(range(100, 400))
    filled(model, system, [], cache)
    for n in range(cache.max_entries + 10):
        filled(model, [5000 + n, *range(7, 40)], [], cache)  # one-off requests
        assert resumed_logits(model, [*system, 42], cache)[1] == len(system), n
