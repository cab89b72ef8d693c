"""The `qwen35-mtp` plugin on the real engine and the tiny `qwen3_5` model: the head loads,
greedy output is token-identical to mlx-lm with MTP on (alone, in a batch, with a cached
prefix, with drafts that are often accepted), per-request opt-out, seeded sampling."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_sampler

from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.runtime import Runtime
from mlxcore.testing import make_runtime as make_test_runtime
from mlxcore_qwen35_mtp.head import MTPHead

PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):",
    "Paris is the capital of",
    "Once upon a time in a land far away",
]


def make_runtime(model: Path, **options: Any) -> Runtime:
    return make_test_runtime(model, "qwen35-mtp", plugin_options=options)


class OracleHead:
    """The real head, with its logits replaced by the known greedy continuation.

    The real MTP module still runs (its cache is fed, rolled back and trimmed as in
    production); only the draft choice is steered: entry ``e`` of a row's head cache
    predicts generated token ``e + 2``, and every ``wrong_every``-th entry proposes a wrong
    token, so rounds accept all, some or none of their drafts.
    """

    def __init__(self, real: MTPHead, reference: list[int], wrong_every: int) -> None:
        self.real = real
        self.reference = reference
        self.wrong_every = wrong_every
        self.make_cache = real.make_cache
        self.forward_main = real.forward_main
        self.verify = real.verify

    def draft(self, tokens: mx.array, hidden: mx.array, cache: list[Any], last: Any = None):
        h, logits = self.real.draft(tokens, hidden, cache, last)
        steps = tokens.shape[1]
        rows = tokens.shape[0]
        offsets = mx.array(cache[0].offset) * mx.ones((rows,), dtype=mx.int32)
        position = mx.array([steps - 1] * rows) if last is None else last
        entries: list[int] = (offsets - steps + position).tolist()  # type: ignore[assignment]
        steered = mx.zeros(logits.shape)
        for b, entry in enumerate(entries):
            token = self.reference[entry + 2] if entry + 2 < len(self.reference) else 0
            if self.wrong_every and entry % self.wrong_every == 0:
                token = (token + 1) % logits.shape[-1]
            steered[b, 0, token] = 10.0
        return h, steered


@pytest.fixture(scope="module")
def rt(tiny_qwen3_5: Path):
    runtime = make_runtime(tiny_qwen3_5, num_speculative_tokens=2, mtp_auto_off=False)
    yield runtime
    runtime.engine.shutdown()


def ids(rt: Runtime, text: str) -> list[int]:
    return list(rt.tokenizer.encode(text))


def reference(rt: Runtime, prompt: list[int], n: int) -> list[int]:
    gen = stream_generate(rt.model, rt.tokenizer, prompt, max_tokens=n, sampler=make_sampler(0.0))
    return [r.token for r in gen]


def run(rt: Runtime, request: GenerationRequest) -> tuple[list[int], FinishEvent]:
    tokens: list[int] = []
    for event in rt.engine.stream(request):
        if isinstance(event, TokenEvent):
            tokens.extend(t.token for t in event.tokens)
        else:
            return tokens, event
    raise AssertionError("stream ended without a finish event")


def run_many(rt: Runtime, requests: list[GenerationRequest]) -> list[tuple[list[int], FinishEvent]]:
    results: list[Any] = [None] * len(requests)

    def worker(i: int) -> None:
        results[i] = run(rt, requests[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(r is not None for r in results)
    return results


def test_head_attached_and_decoder_chosen(rt: Runtime) -> None:
    head = rt.model.mlxcore_mtp
    assert rt.engine.decoder.name == "qwen35-mtp"
    # shared, not copied: the very embedding module of the model
    assert head.embed is rt.model.language_model.model.embed_tokens
    # the w - 1 norm convention was undone (random-init RMSNorm weights are ones)
    norm = head.module.pre_fc_norm_hidden.weight
    assert mx.allclose(norm, mx.ones_like(norm)).item()


def test_greedy_identical_alone_real_head(rt: Runtime) -> None:
    for text in PROMPTS:
        prompt = ids(rt, text)
        tokens, finish = run(rt, GenerationRequest(prompt, 24))
        assert tokens == reference(rt, prompt, 24), text
        assert "speculative_acceptance" in finish.usage.extra
        assert finish.usage.extra["speculative_tokens_per_step"] >= 1.0


@pytest.mark.parametrize("k,wrong_every", [(1, 3), (3, 4), (3, 2)])
def test_greedy_identical_with_accepted_drafts(rt: Runtime, k: int, wrong_every: int) -> None:
    decoder = rt.engine.decoder
    real, old_k = decoder.head, decoder.k
    prompt = ids(rt, PROMPTS[1])
    ref = reference(rt, prompt, 40)
    decoder.head, decoder.k = OracleHead(real, ref, wrong_every), k
    try:
        tokens, finish = run(rt, GenerationRequest(prompt, 40))
    finally:
        decoder.head, decoder.k = real, old_k
    assert tokens == ref
    extra = finish.usage.extra
    assert 0.3 < extra["speculative_acceptance"] < 1.0  # accepted and rejected drafts
    assert extra["speculative_tokens_per_step"] > 1.2


def test_greedy_identical_in_batch_with_other_sequences(rt: Runtime) -> None:
    decoder = rt.engine.decoder
    real = decoder.head
    spec_prompt = ids(rt, PROMPTS[2])
    ref = reference(rt, spec_prompt, 30)
    others = [ids(rt, p) for p in (PROMPTS[0], PROMPTS[3])]
    requests = [
        GenerationRequest(spec_prompt, 30),
        GenerationRequest(spec_prompt, 30),
        GenerationRequest(others[0], 20, options={"speculative": False}),
        GenerationRequest(others[1], 20),
    ]
    decoder.head = OracleHead(real, ref, 3)
    try:
        results = run_many(rt, requests)
    finally:
        decoder.head = real
    assert results[0][0] == ref and results[1][0] == ref
    assert results[2][0] == reference(rt, others[0], 20)
    assert results[3][0] == reference(rt, others[1], 20)
    assert "speculative_acceptance" not in results[2][1].usage.extra


def test_moe_checkpoint_head_loads_and_stays_lossless(tiny_qwen3_5_moe: Path) -> None:
    """Qwen3.5 MoE: the head's MoE layer comes from the checkpoint's fused experts;
    with drafts accepted and rejected (oracle head), alone and two at once, greedy
    output is mlx-lm's."""
    runtime = make_runtime(tiny_qwen3_5_moe, num_speculative_tokens=2, mtp_auto_off=False)
    try:
        decoder = runtime.engine.decoder
        assert decoder.name == "qwen35-mtp"
        assert hasattr(decoder.head.module.layers[0].mlp, "switch_mlp")
        for text in PROMPTS[:2]:
            prompt = ids(runtime, text)
            tokens, finish = run(runtime, GenerationRequest(prompt, 20))
            assert tokens == reference(runtime, prompt, 20), text
            assert "speculative_acceptance" in finish.usage.extra
        prompt = ids(runtime, PROMPTS[2])
        ref = reference(runtime, prompt, 24)
        real = decoder.head
        decoder.head = OracleHead(real, ref, 3)
        try:
            results = run_many(runtime, [GenerationRequest(prompt, 24)] * 2)
        finally:
            decoder.head = real
        for tokens, finish in results:
            assert tokens == ref
            assert finish.usage.extra["speculative_acceptance"] > 0.3
    finally:
        runtime.engine.shutdown()


def test_above_batch_limit_falls_back_to_plain(tiny_qwen3_5: Path) -> None:
    runtime = make_runtime(tiny_qwen3_5, speculative_disable_by_batch_size=1)
    try:
        prompts = [ids(runtime, p) for p in PROMPTS[:3]]
        results = run_many(runtime, [GenerationRequest(p, 16) for p in prompts])
        for prompt, (tokens, _) in zip(prompts, results, strict=True):
            assert tokens == reference(runtime, prompt, 16)
        assert runtime.engine.decoder.stats()["speculative_plain_batch"] >= 1
    finally:
        runtime.engine.shutdown()


def test_cached_prefix_then_speculation(rt: Runtime) -> None:
    prompt = ids(rt, PROMPTS[3])
    first, _ = run(rt, GenerationRequest(prompt, 12))
    longer = prompt + first + ids(rt, " and then")
    tokens, finish = run(rt, GenerationRequest(longer, 20))
    assert tokens == reference(rt, longer, 20)
    assert finish.usage.cached_tokens > 0


def test_cached_prefix_with_accepted_drafts(rt: Runtime) -> None:
    decoder = rt.engine.decoder
    real = decoder.head
    prompt = ids(rt, PROMPTS[0])
    first, _ = run(rt, GenerationRequest(prompt, 10))
    longer = prompt + first + ids(rt, " so")
    ref = reference(rt, longer, 30)
    decoder.head = OracleHead(real, ref, 4)
    try:
        tokens, finish = run(rt, GenerationRequest(longer, 30))
    finally:
        decoder.head = real
    assert tokens == ref
    assert finish.usage.cached_tokens > 0
    assert finish.usage.extra["speculative_acceptance"] > 0.3


def test_speculative_false_request_decodes_plainly(rt: Runtime) -> None:
    prompt = ids(rt, PROMPTS[0])
    before = rt.engine.decoder.stats()["speculative_plain_request"]
    tokens, finish = run(rt, GenerationRequest(prompt, 16, options={"speculative": False}))
    assert tokens == reference(rt, prompt, 16)
    assert rt.engine.decoder.stats()["speculative_plain_request"] == before + 1
    assert "speculative_acceptance" not in finish.usage.extra


def test_seeded_sampling_at_temperature_one(rt: Runtime) -> None:
    decoder = rt.engine.decoder
    real = decoder.head
    prompt = ids(rt, PROMPTS[1])
    ref = reference(rt, prompt, 30)
    sampling = SamplingParams(temperature=1.0, seed=7, logprobs=True, top_logprobs=2)
    decoder.head = OracleHead(real, ref, 0)
    try:
        a, fa = run(rt, GenerationRequest(prompt, 30, sampling=sampling))
        b, _ = run(rt, GenerationRequest(prompt, 30, sampling=sampling))
    finally:
        decoder.head = real
    assert len(a) == 30 and a == b  # same seed, same path: same tokens
    assert fa.reason == "length"
    assert fa.usage.extra["speculative_tokens_per_step"] >= 1.0


def test_off_switch_when_head_never_agrees(tiny_qwen3_5: Path) -> None:
    runtime = make_runtime(tiny_qwen3_5)
    try:
        prompt = ids(runtime, PROMPTS[0])
        tokens, finish = run(runtime, GenerationRequest(prompt, 40))
        assert tokens == reference(runtime, prompt, 40)
        # random weights: the head (almost) never agrees, so speculation costs more than it
        # gives and the sequence finishes in the plain decoder
        assert finish.usage.extra.get("speculative_switched_off") == "slow"
    finally:
        runtime.engine.shutdown()


def test_greedy_identical_batch_of_eight(rt: Runtime) -> None:
    """Eight requests at once: sequences start speculating, then move to the plain batch
    when it grows past the limit (4); every output still equals mlx-lm's."""
    texts = [*PROMPTS, "1, 2, 3, 4,", "The meaning of life is", "Roses are red", "In the beginning"]
    prompts = [ids(rt, t) for t in texts]
    results = run_many(rt, [GenerationRequest(p, 16) for p in prompts])
    for prompt, (tokens, _) in zip(prompts, results, strict=True):
        assert tokens == reference(rt, prompt, 16)


#: The issue's 20 prompts: PROMPTS plus sixteen more, varied in length and content.
TWENTY = [
    *PROMPTS,
    "1, 2, 3, 4,",
    "The meaning of life is",
    "Roses are red",
    "In the beginning",
    "import numpy as np\n",
    "Dear Sir or Madam,",
    "The mitochondria is",
    "SELECT * FROM users WHERE",
    "A long time ago, in a galaxy",
    "To be or not to be",
    "Knock knock.",
    "Water boils at",
    "<html><body>",
    "The recipe needs three eggs, two cups of flour and",
    "Q: What is 7 times 8?\nA:",
    "Translate to French: good morning",
]


@pytest.mark.long  # 16 s on CI's two cores; the tests above cover each case with fewer prompts
def test_twenty_prompts_alone_batched_and_cached(tiny_qwen3_5: Path) -> None:
    """Greedy output with MTP on equals mlx-lm's for 20 prompts: one at a time, in
    batches of 8 that all speculate together (one verification pass per round, per-row
    rollback: the random head's drafts are rejected nearly every round), and as
    follow-ups whose prompt starts with a cached prefix."""
    runtime = make_runtime(
        tiny_qwen3_5,
        num_speculative_tokens=2,
        mtp_auto_off=False,
        speculative_disable_by_batch_size=8,
    )
    try:
        prompts = [ids(runtime, t) for t in TWENTY]
        expected = [reference(runtime, p, 12) for p in prompts]
        for prompt, want in zip(prompts, expected, strict=True):
            tokens, finish = run(runtime, GenerationRequest(prompt, 12))
            assert tokens == want
            assert "speculative_acceptance" in finish.usage.extra  # it did speculate
        for start in range(0, len(prompts), 8):
            group = prompts[start : start + 8]
            results = run_many(runtime, [GenerationRequest(p, 12) for p in group])
            for (tokens, finish), want in zip(results, expected[start : start + 8], strict=True):
                assert tokens == want
                assert "speculative_switched_off" not in finish.usage.extra
        for prompt, first in zip(prompts, expected, strict=True):
            longer = prompt + first + ids(runtime, " Next:")
            tokens, finish = run(runtime, GenerationRequest(longer, 12))
            assert tokens == reference(runtime, longer, 12)
            assert finish.usage.cached_tokens > 0
    finally:
        runtime.engine.shutdown()
