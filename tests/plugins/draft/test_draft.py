"""Draft-model speculative decoding through the real engine: lossless greedy output (alone,
eight at once, after a prefix-cache hit; dense qwen3 and llama, hybrid qwen3_5 target and
draft), the draft's cache rolled back exactly, the target's distribution at temperature 1,
structured output, and the start-up refusals."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.config import ServerConfig
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.errors import UsageError
from mlxcore.models.drafts import tokenizer_difference
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
from mlxcore_draft import mlxcore_configure
from mlxcore_qwen35_mtp.testing import TINY_SIZE, build_mtp_model

pytestmark = pytest.mark.xdist_group("draft")


@pytest.fixture
def runtimes() -> Iterator[Any]:
    made: list[Runtime] = []

    def make(model: Path, draft: Path, **options: Any) -> Runtime:
        options = {"draft_model": str(draft), "draft_auto_off": False, **options}
        made.append(make_runtime(model, "draft", plugin_options=options))
        return made[-1]

    yield make
    for rt in made:
        rt.engine.shutdown()


def prompts(seed: int, count: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    lengths = [rng.randrange(8, 40) for _ in range(count)]
    return [tuple(rng.randrange(300, 3000) for _ in range(n)) for n in lengths]


def assert_lossless(rt: Runtime, requests: list[GenerationRequest], results: list[Result]) -> None:
    for req, res in zip(requests, results, strict=True):
        assert res.finish is not None and res.finish.reason in ("length", "stop"), res.finish
        expected = reference_tokens(rt, req.prompt_tokens, req.max_tokens)
        assert res.tokens == expected[: len(res.tokens)], len(req.prompt_tokens)


@pytest.mark.parametrize(
    "arch",
    [  # dense qwen3 draft on qwen3 is also checked against mlx-lm in test_loaded_once.py
        pytest.param("qwen3", marks=pytest.mark.long),
        pytest.param("llama", marks=pytest.mark.long),
        "qwen3_5",
    ],
)
def test_greedy_output_is_the_plain_decoders_alone_together_and_cached(
    arch: str, mlxcore_model_factory: Any, runtimes: Any
) -> None:
    target = mlxcore_model_factory(arch)
    # a different model of the same family and tokenizer: it agrees sometimes, so rounds
    # accept some drafts and reject others (the same model agrees always: see below)
    fewer = {} if arch == "qwen3_5" else {"num_hidden_layers": 2}  # keep its attention layer
    draft = mlxcore_model_factory(arch, seed=1, **fewer)
    rt = runtimes(target, draft)
    batch = prompts(7, 20)
    alone = [GenerationRequest(p, 16, checkpoints=(len(p) - 2,)) for p in batch[:4]]
    for req in alone:
        assert_lossless(rt, [req], submit_together(rt, [req]))
    together = [GenerationRequest(p, 16, checkpoints=(len(p) - 2,)) for p in batch[4:12]]
    assert_lossless(rt, together, submit_together(rt, together))
    turns = [GenerationRequest((*p, 17, *p[:5]), 16) for p in batch[:8]]
    results = submit_together(rt, turns)
    assert_lossless(rt, turns, results)
    assert all(r.finish is not None and r.finish.usage.cached_tokens > 0 for r in results)
    stats = rt.engine.decoder.stats()
    assert stats["speculative_accepted"] > 0
    assert stats["speculative_drafted"] > stats["speculative_accepted"]
    assert stats["speculative_plain_batch"] == 0  # all eight speculated together


def _reference_drafts(draft: Any, context: list[int], k: int) -> list[mx.array]:
    """The draft's own greedy logits for ``k`` chained positions after ``context``, from
    a fresh cache: what a correctly rolled-back batch cache must reproduce."""
    cache = make_prompt_cache(draft)
    logits = draft(mx.array(context)[None], cache=cache)[0, -1]
    out = []
    for _ in range(k):
        out.append(logits)
        token = mx.argmax(logits)
        logits = draft(token.reshape(1, 1), cache=cache)[0, -1]
    return out


@pytest.mark.parametrize("arch", ["qwen3", pytest.param("qwen3_5", marks=pytest.mark.long)])
def test_the_draft_cache_follows_the_target_after_rejections(
    arch: str, mlxcore_model_factory: Any, runtimes: Any
) -> None:
    model = mlxcore_model_factory(arch)
    rt = runtimes(model, model)  # the draft is the target: only the penalty rejects
    decoder = rt.engine.decoder
    propose = decoder.propose
    checked: list[bool] = []

    def checking(rows: Any, emitted: Any, kept: Any, width: int, extra: Any) -> None:
        propose(rows, emitted, kept, width, extra)
        for row, new in zip(rows, emitted, strict=True):
            context = [*row.seq.tokens, *new]
            expected = _reference_drafts(decoder.draft, context, len(row.drafts))
            for draft, logits in zip(row.drafts, expected, strict=True):
                # the proposed draft is the fresh cache's argmax (up to rounding ties)
                gap = (logits.max() - logits[draft.item()]).item()
                checked.append(gap < 1e-3)

    decoder.propose = checking  # this one decoder instance only
    # a repetition penalty changes the target's choice where the model would repeat; the
    # draft, which does not see it, proposes the repeat and is rolled back
    sampling = SamplingParams(repetition_penalty=1.8)
    requests = [GenerationRequest(p, 24, sampling=sampling) for p in prompts(11, 6)]
    results = submit_together(rt, requests)
    assert all(r.finish is not None and r.finish.reason == "length" for r in results)
    stats = decoder.stats()
    assert stats["speculative_drafted"] > stats["speculative_accepted"] > 0  # rolled back
    assert len(checked) > 50 and all(checked)


def test_the_drafts_cache_counts_in_the_memory_budget(
    mlxcore_model_factory: Any, runtimes: Any
) -> None:
    target = mlxcore_model_factory("qwen3")
    draft_path = mlxcore_model_factory("qwen3", seed=1, num_hidden_layers=1)
    config = json.loads((draft_path / "config.json").read_text())
    # keys and values of every layer, float32: the draft's KV per token, from its config
    expected = 2 * 4 * config["num_hidden_layers"] * config["num_key_value_heads"]
    expected *= config["head_dim"]
    rt = runtimes(target, draft_path)
    memory = rt.engine.memory
    assert memory.side_per_token == rt.engine.decoder.side_cache_bytes_per_token() == expected
    assert memory.cost(100) == 100 * (memory.per_token + expected)
    assert rt.engine.stats()["memory_side_kv_bytes_per_token"] == expected
    plain = make_runtime(target)
    try:
        assert plain.engine.memory.side_per_token == 0
        assert plain.engine.memory.cost(100) == 100 * memory.per_token  # same target
        alone, with_draft = plain.engine.limits.memory_context, rt.engine.limits.memory_context
        assert alone is not None and with_draft is not None and with_draft < alone
    finally:
        plain.engine.shutdown()


def test_a_request_can_turn_it_off(tiny_qwen3: Path, runtimes: Any) -> None:
    rt = runtimes(tiny_qwen3, tiny_qwen3)
    req = GenerationRequest(prompts(3, 1)[0], 16, options={"speculative": False})
    (res,) = submit_together(rt, [req])
    assert_lossless(rt, [req], [res])
    assert rt.engine.decoder.stats()["speculative_plain_request"] == 1
    assert res.finish is not None and "speculative_acceptance" not in res.finish.usage.extra


def test_temperature_one_keeps_the_targets_distribution(
    tmp_path_factory: pytest.TempPathFactory, runtimes: Any
) -> None:
    root = tmp_path_factory.mktemp("draft-sampling")
    target, draft = root / "target", root / "draft"
    build_mtp_model(target, size=TINY_SIZE, merges=0, scale=6.0, agree=0.8, seed=3)
    # same tokenizer, a different next-token map: the draft's q differs from p
    build_mtp_model(draft, size=TINY_SIZE, merges=0, scale=3.0, agree=0.8, seed=5)
    rt = runtimes(target, draft, speculative_disable_by_batch_size=128)
    prompt = list(rt.tokenizer.encode("The quick brown fox"))
    spec, plain, drafted, accepted = sample_both_arms(rt, prompt)
    assert drafted >= REQUESTS * TOKENS * 0.5
    assert accepted >= 10 and accepted < 0.95 * drafted  # both paths of the rule ran
    assert_same_distribution(exact_p(rt), prompt, spec, plain)


def test_structured_output_sees_every_verified_token(tiny_qwen3: Path, runtimes: Any) -> None:
    assert_structured_same_on_off(runtimes(tiny_qwen3, tiny_qwen3), '{"tags": ["a", "b"]} again: ')


def test_thinking_budget_counts_only_verified_tokens(tiny_qwen3: Path, runtimes: Any) -> None:
    """The draft (here the model itself) never proposes the forced close: verification
    rejects its guesses there, and the budget still closes at the same token."""
    assert_thinking_budget_same_on_off(runtimes(tiny_qwen3, tiny_qwen3), "Think about it:")


def test_a_draft_model_is_required() -> None:
    with pytest.raises(UsageError, match="--draft-model"):
        mlxcore_configure(ServerConfig(model="x", plugin_options={}))


def test_a_draft_with_another_tokenizer_is_refused(
    tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = tmp_path_factory.mktemp("draft-other-tokenizer") / "m"
    build_mtp_model(other, size=TINY_SIZE, merges=0, seed=1)  # a cut of the Qwen3 tokenizer
    options = {"draft_model": str(other)}
    with pytest.raises(UsageError, match="tokenizer differs from the target's"):
        make_runtime(tiny_qwen3, "draft", plugin_options=options)


def test_a_draft_that_cannot_run_is_refused(tiny_qwen3: Path, mlxcore_model_factory: Any) -> None:
    broken = mlxcore_model_factory("qwen3_5", num_hidden_layers=2)  # no attention layer left
    with pytest.raises(UsageError, match="cannot run"):
        make_runtime(tiny_qwen3, "draft", plugin_options={"draft_model": str(broken)})


def test_a_target_with_sliding_window_layers_is_refused(
    tiny_gemma4: Path, tiny_qwen3: Path
) -> None:
    with pytest.raises(UsageError, match="cannot roll back"):
        make_runtime(tiny_gemma4, "draft", plugin_options={"draft_model": str(tiny_qwen3)})


def test_tokenizer_difference_names_the_first_token() -> None:
    assert tokenizer_difference({"a": 0, "b": 1}, {"a": 0, "b": 1}) is None
    assert "'b' (id 1): the draft has it as id 2" in str(
        tokenizer_difference({"a": 0, "b": 1}, {"a": 0, "b": 2})
    )
    assert "no such token" in str(tokenizer_difference({"a": 0, "<x>": 1}, {"a": 0}))
    assert "tokens the target lacks" in str(tokenizer_difference({"a": 0}, {"a": 0, "z": 5}))
