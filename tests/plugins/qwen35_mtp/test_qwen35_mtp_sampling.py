"""Sampling through the engine keeps the model's distribution with MTP speculation on.

The model (``mlxcore_qwen35_mtp.testing``, small Qwen3 BPE vocabulary of 282 tokens) has
zero output projections, so its next-token distribution ``p(. | t)`` depends only on the
current token ``t`` and is computed exactly here. Its MTP head is a noisy copy of the
model's map, so drafts are accepted often but not always (the head's distribution ``q``
differs from ``p``). Many seeded requests at temperature 1 run through the real engine
and the real batched speculative decoder; every emitted transition ``prev -> next`` is
binned by the rank of ``next`` under ``p(. | prev)``, and Pearson's chi-square compares the
bin counts with their exact expectation (and the speculative counts with the plain ones).
A decoder that accepted drafts without the ``min(1, p/q)`` rule emits ``q``-distributed
tokens at accepted positions and fails both checks by a wide margin (checked by breaking
the rule locally; see docs/plugins/qwen35-mtp.md).
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime
from mlxcore_qwen35_mtp.testing import TINY_SIZE, build_mtp_model

REQUESTS = 96
TOKENS = 24
BINS = ((0, 1), (1, 2), (2, 4), (4, 10), (10, 10**9))
"""Rank ranges under ``p(. | prev)``: the top token, the second, 3-4, 5-10, the rest."""

CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}
"""Chi-square quantiles at 0.999 by degrees of freedom (a false alarm once in 1000 runs)."""


@pytest.fixture(scope="module")
def sampling_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mtp-sampling") / "model"
    build_mtp_model(folder, size=TINY_SIZE, merges=0, scale=6.0, agree=0.8, seed=3)
    return folder


@pytest.fixture(scope="module")
def rt(sampling_model: Path):
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("qwen35-mtp",), autoload=False))
    hooks = PluginHooks(pm)
    options = {
        "num_speculative_tokens": 2,
        "mtp_auto_off": False,
        "speculative_disable_by_batch_size": 64,
    }
    cfg = ServerConfig(model=str(sampling_model), plugin_options=options)
    hooks.configure(cfg)
    runtime = build_runtime(cfg, hooks)
    yield runtime
    runtime.engine.shutdown()


def exact_p(rt: Runtime) -> mx.array:
    """``p(next | current)`` for every current token, (V, V): the model is context-free."""
    vocab = rt.model.language_model.args.vocab_size
    logits = rt.model(mx.arange(vocab)[:, None])[:, 0]
    return mx.softmax(logits.astype(mx.float32), axis=-1)


def generate(rt: Runtime, prompt: list[int], options: dict[str, Any]) -> list[list[int]]:
    """REQUESTS seeded requests at temperature 1, all submitted at once (16 run together)."""
    sinks: list[queue.SimpleQueue[Any]] = []
    for i in range(REQUESTS):
        sink: queue.SimpleQueue[Any] = queue.SimpleQueue()
        sampling = SamplingParams(temperature=1.0, seed=1000 + i)
        rt.engine.submit(GenerationRequest(prompt, TOKENS, sampling, options=options), sink.put)
        sinks.append(sink)
    out = []
    for sink in sinks:
        tokens: list[int] = []
        while True:
            event = sink.get(timeout=300)
            if isinstance(event, TokenEvent):
                tokens.extend(t.token for t in event.tokens)
            elif isinstance(event, FinishEvent):
                break
        assert len(tokens) == TOKENS  # the model never predicts EOS
        out.append(tokens)
    return out


def binned(p: mx.array, prompt: list[int], outputs: list[list[int]]) -> tuple[list, list]:
    """Observed bin counts and their exact expectation over every emitted transition."""
    ranks = mx.argsort(-p, axis=-1)
    position = mx.argsort(ranks, axis=-1)  # position[t, x] = rank of x under p(. | t)
    sorted_p = mx.take_along_axis(p, ranks, axis=-1)
    cumulative = mx.concatenate([mx.zeros((p.shape[0], 1)), mx.cumsum(sorted_p, axis=-1)], axis=1)
    prev_list, next_list = [], []
    for tokens in outputs:
        chain = [prompt[-1], *tokens]
        prev_list += chain[:-1]
        next_list += chain[1:]
    prev = mx.array(prev_list)
    rank = position[prev, mx.array(next_list)]
    observed, expected = [], []
    vocab = p.shape[-1]
    for lo, hi in BINS:
        hi = min(hi, vocab)
        observed.append(int(((rank >= lo) & (rank < hi)).sum().item()))
        mass = cumulative[prev, hi] - cumulative[prev, lo]
        expected.append(float(mass.sum().item()))
    return observed, expected


def chi2(observed: list[int], expected: list[float]) -> float:
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))


def homogeneity(a: list[int], b: list[int]) -> float:
    """Pearson's chi-square that two samples of bin counts share one distribution."""
    total_a, total_b = sum(a), sum(b)
    stat = 0.0
    for x, y in zip(a, b, strict=True):
        pooled = (x + y) / (total_a + total_b)
        for count, total in ((x, total_a), (y, total_b)):
            stat += (count - pooled * total) ** 2 / (pooled * total)
    return stat


def test_temperature_one_distribution_unchanged_by_speculation(rt: Runtime) -> None:
    prompt = list(rt.tokenizer.encode("The quick brown fox"))
    p = exact_p(rt)
    before = rt.engine.decoder.stats()
    spec = generate(rt, prompt, {})
    after = rt.engine.decoder.stats()
    plain = generate(rt, prompt, {"speculative": False})

    drafted = after["speculative_drafted"] - before["speculative_drafted"]
    accepted = after["speculative_accepted"] - before["speculative_accepted"]
    # not vacuous: most tokens went through verified rounds, with accepted AND rejected drafts
    assert drafted >= REQUESTS * TOKENS * 0.6
    assert 0.2 < accepted / drafted < 0.9
    moved = rt.engine.decoder.stats()["speculative_plain_request"]
    assert moved - after["speculative_plain_request"] == REQUESTS  # the plain arm was plain

    dof = len(BINS) - 1
    obs_spec, exp_spec = binned(p, prompt, spec)
    obs_plain, exp_plain = binned(p, prompt, plain)
    assert min(exp_spec) >= 5 and min(exp_plain) >= 5  # the chi-square approximation holds
    assert chi2(obs_spec, exp_spec) < CHI2_999[dof], (obs_spec, exp_spec)
    assert chi2(obs_plain, exp_plain) < CHI2_999[dof], (obs_plain, exp_plain)
    assert homogeneity(obs_spec, obs_plain) < CHI2_999[dof], (obs_spec, obs_plain)
