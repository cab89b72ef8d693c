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

from pathlib import Path

import pytest

from mlxcore.config import ServerConfig
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime
from mlxcore.testing.distribution import (
    REQUESTS,
    TOKENS,
    assert_same_distribution,
    exact_p,
    sample_both_arms,
)
from mlxcore_qwen35_mtp.testing import TINY_SIZE, build_mtp_model


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
    # batches of 32 stay under the speculation's batch limit (64) with 96 requests queued
    cfg = ServerConfig(model=str(sampling_model), plugin_options=options, max_num_seqs=32)
    hooks.configure(cfg)
    runtime = build_runtime(cfg, hooks)
    yield runtime
    runtime.engine.shutdown()


def test_temperature_one_distribution_unchanged_by_speculation(rt: Runtime) -> None:
    prompt = list(rt.tokenizer.encode("The quick brown fox"))
    before = rt.engine.decoder.stats()["speculative_plain_request"]
    spec, plain, drafted, accepted = sample_both_arms(rt, prompt)
    # not vacuous: most tokens went through verified rounds, with accepted AND rejected drafts
    assert drafted >= REQUESTS * TOKENS * 0.6
    assert 0.2 < accepted / drafted < 0.9
    moved = rt.engine.decoder.stats()["speculative_plain_request"]
    assert moved - before == REQUESTS  # the plain arm was plain (the speculative one was not)
    assert_same_distribution(exact_p(rt), prompt, spec, plain)
