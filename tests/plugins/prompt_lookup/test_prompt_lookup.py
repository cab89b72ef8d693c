"""Prompt-lookup speculative decoding through the real engine: lossless greedy output
(alone, eight at once, after a prefix-cache hit; dense qwen3 and llama, hybrid qwen3_5),
the model's own distribution at temperature 1, structured output, the n-gram index."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import UsageError
from mlxcore.runtime import Runtime
from mlxcore.testing.distribution import (
    REQUESTS,
    TOKENS,
    assert_same_distribution,
    exact_p,
    sample_both_arms,
)
from mlxcore.testing.runtime import (
    Result,
    assert_structured_same_on_off,
    assert_thinking_budget_same_on_off,
    make_runtime,
    reference_tokens,
    submit_together,
)
from mlxcore_prompt_lookup import mlxcore_configure
from mlxcore_prompt_lookup.ngram import NgramIndex
from mlxcore_qwen35_mtp.testing import TINY_SIZE, build_mtp_model

NO_AUTO_OFF = {"lookup_auto_off": False}


@pytest.fixture
def runtimes() -> Iterator[Any]:
    made: list[Runtime] = []

    def make(model: Path, **options: Any) -> Runtime:
        made.append(make_runtime(model, "prompt-lookup", plugin_options=options))
        return made[-1]

    yield make
    for rt in made:
        rt.engine.shutdown()


def prompts(seed: int, count: int) -> list[tuple[int, ...]]:
    """Prompts that repeat part of themselves, so the lookup finds something to copy."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        body = [rng.randrange(300, 3000) for _ in range(rng.randrange(12, 40))]
        tail = [rng.randrange(300, 3000) for _ in range(rng.randrange(1, 12))]
        out.append((*body, *body[: rng.randrange(4, 12)], *tail))
    return out


def assert_lossless(rt: Runtime, requests: list[GenerationRequest], results: list[Result]) -> None:
    for req, res in zip(requests, results, strict=True):
        assert res.finish is not None and res.finish.reason in ("length", "stop"), res.finish
        expected = reference_tokens(rt, req.prompt_tokens, req.max_tokens)
        assert res.tokens == expected[: len(res.tokens)], len(req.prompt_tokens)


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_llama", "tiny_qwen3_5"])
def test_greedy_output_is_the_plain_decoders_alone_together_and_cached(
    family: str, request: pytest.FixtureRequest, runtimes: Any
) -> None:
    rt = runtimes(
        request.getfixturevalue(family), **NO_AUTO_OFF, speculative_disable_by_batch_size=8
    )
    batch = prompts(7, 20)
    # a history checkpoint where each prompt ends, so the next turn hits the cache on the
    # hybrid model too (its recurrent state is reused only at an exact prefix)
    alone = [GenerationRequest(p, 24, checkpoints=(len(p) - 2,)) for p in batch[:4]]
    for req in alone:
        assert_lossless(rt, [req], submit_together(rt, [req]))
    together = [GenerationRequest(p, 24, checkpoints=(len(p) - 2,)) for p in batch[4:12]]
    assert_lossless(rt, together, submit_together(rt, together))
    # the next turn of the first eight: their prompts come back longer (a cache hit each)
    turns = [GenerationRequest((*p, 17, *p[:5]), 24) for p in batch[:8]]
    results = submit_together(rt, turns)
    assert_lossless(rt, turns, results)
    assert all(r.finish is not None and r.finish.usage.cached_tokens > 0 for r in results)
    stats = rt.engine.decoder.stats()
    assert stats["speculative_accepted"] > 0  # drafts were verified and taken, not only proposed
    assert stats["speculative_drafted"] > stats["speculative_accepted"] or family != "tiny_qwen3_5"
    assert stats["speculative_plain_batch"] == 0  # all eight speculated together
    # what tracing reports: each request's decode steps, some of them rounds that took drafts
    tallies = [next(s for s in r.finish.usage.steps if s.name == "decode") for r in results]
    for tally, res in zip(tallies, results, strict=True):
        assert tally.figures["tokens"] == len(res.tokens) - 1  # the first came from prefill
    assert sum(t.figures["multi_token_steps"] for t in tallies) > 0


def test_a_request_can_turn_it_off(tiny_qwen3: Path, runtimes: Any) -> None:
    rt = runtimes(tiny_qwen3, **NO_AUTO_OFF)
    req = GenerationRequest(prompts(3, 1)[0], 16, options={"speculative": False})
    (res,) = submit_together(rt, [req])
    assert_lossless(rt, [req], [res])
    assert rt.engine.decoder.stats()["speculative_plain_request"] == 1
    assert res.finish is not None and "speculative_acceptance" not in res.finish.usage.extra


def test_temperature_one_keeps_the_models_distribution(
    tmp_path_factory: pytest.TempPathFactory, runtimes: Any
) -> None:
    folder = tmp_path_factory.mktemp("lookup-sampling") / "model"
    build_mtp_model(folder, size=TINY_SIZE, merges=0, scale=6.0, agree=0.8, seed=3)
    # one-token matches: many drafts (most of them wrong), so the rule runs often
    rt = runtimes(folder, **NO_AUTO_OFF, speculative_disable_by_batch_size=128, lookup_min_ngram=1)
    prompt = list(rt.tokenizer.encode("The quick brown fox"))
    spec, plain, drafted, accepted = sample_both_arms(rt, prompt)
    # a small vocabulary: the lookup proposes often; at temperature 1 most copies are
    # rejected (measured: ~640 drafts, ~25 accepted), so both paths of the rule run
    assert drafted >= REQUESTS * TOKENS * 0.2
    assert accepted >= 10 and accepted < 0.95 * drafted
    assert_same_distribution(exact_p(rt), prompt, spec, plain)


def test_structured_output_sees_every_verified_token(tiny_qwen3: Path, runtimes: Any) -> None:
    rt = runtimes(tiny_qwen3, **NO_AUTO_OFF)
    assert_structured_same_on_off(rt, '{"tags": ["a", "b", "a", "b"]} again: ')


def test_thinking_budget_counts_only_verified_tokens(tiny_qwen3: Path, runtimes: Any) -> None:
    rt = runtimes(tiny_qwen3, **NO_AUTO_OFF, lookup_min_ngram=1)
    assert_thinking_budget_same_on_off(rt, "a b c a b c a b c a b c a b c", budget=9)


def test_the_index_proposes_what_followed_the_latest_earlier_ending() -> None:
    index = NgramIndex(max_n=3, min_n=1)
    index.extend([1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3])
    assert index.propose(3) == [5, 7, 1]  # "1 2 3" last ended before "5 7 1"
    index.extend([5])
    assert index.propose(2) == [7, 1]  # "2 3 5" (the longest ending that occurred before)
    index.extend([8])
    assert index.propose(4) == []  # "8" never occurred before
    index.extend([1])
    assert index.propose(2) == [2, 3]  # only "1" matches: its latest earlier occurrence
    assert NgramIndex(2).propose(3) == []  # an empty context proposes nothing


def test_bad_ngram_bounds_are_refused() -> None:
    from mlxcore.config import ServerConfig

    with pytest.raises(UsageError, match="--lookup-min-ngram"):
        mlxcore_configure(
            ServerConfig(model="x", plugin_options={"lookup_ngram": 2, "lookup_min_ngram": 3})
        )
    with pytest.raises(UsageError, match="--lookup-ngram"):
        mlxcore_configure(ServerConfig(model="x", plugin_options={"lookup_ngram": 0}))
