"""The small-vocabulary tokenizer and the MTP test-model builder do what the benchmark and
the sampling test rely on: every text still tokenizes, the model's greedy next token is its
permutation, the head agrees about as often as asked (measured through the real engine,
MTP on, greedy output identical to mlx-lm), and a "never" head is switched off."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load, stream_generate
from mlx_lm.sample_utils import make_sampler

from mlxcore.config import ServerConfig
from mlxcore.engine.events import FinishEvent, TokenEvent
from mlxcore.engine.request import GenerationRequest
from mlxcore.hooks import PluginHooks
from mlxcore.plugins import PluginSelection, create_plugin_manager, load_plugins
from mlxcore.runtime import Runtime, build_runtime
from mlxcore.testing.small_vocab import write_small_qwen3_tokenizer
from mlxcore_qwen35_mtp.testing import TINY_SIZE, build_mtp_model


def test_small_tokenizer_round_trips_any_text(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    ids = write_small_qwen3_tokenizer(tmp_path, merges=100)
    assert ids.vocab_len == 256 + 100 + 26
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "Hello, wörld! 日本語 🙂\n\tdef f(x): return x"
    encoded = tok.encode(text)
    assert max(encoded) < 356 and tok.decode(encoded) == text
    assert tok.convert_tokens_to_ids("<|im_end|>") == ids.eos[0] == 356 + 2
    assert tok.encode("<|im_start|>user")[0] == 356 + 1  # special tokens stay atomic


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp-builder")
    out = {}
    for head in ("agree", "never"):
        out[head] = root / head
        build_mtp_model(out[head], size=TINY_SIZE, merges=200, agree=0.8, head=head, seed=5)
    return out


def runtime(path: Path, **options: object) -> Runtime:
    pm = create_plugin_manager()
    load_plugins(pm, PluginSelection(enable=("qwen35-mtp",), autoload=False))
    hooks = PluginHooks(pm)
    cfg = ServerConfig(model=str(path), plugin_options=dict(options))
    hooks.configure(cfg)
    return build_runtime(cfg, hooks)


def generate(rt: Runtime, prompt: list[int], n: int) -> tuple[list[int], FinishEvent]:
    tokens: list[int] = []
    for event in rt.engine.stream(GenerationRequest(prompt, n)):
        if isinstance(event, TokenEvent):
            tokens.extend(t.token for t in event.tokens)
        elif isinstance(event, FinishEvent):
            return tokens, event
    raise AssertionError("no finish event")


def test_model_follows_its_permutation_and_head_agrees(models: dict[str, Path]) -> None:
    info = json.loads((models["agree"] / "mtp-test-model.json").read_text())
    assert abs(info["head_agreement"] - 0.8) < 0.02
    model, tokenizer = load(str(models["agree"]))
    logits = model(mx.arange(info["regular_tokens"])[:, None])[:, 0]
    nxt = mx.argmax(logits, axis=-1)
    # a permutation of the regular tokens: never a special token, every token once
    assert int(nxt.max().item()) < info["regular_tokens"]
    assert len(set(nxt.tolist())) == info["regular_tokens"]

    rt = runtime(models["agree"], num_speculative_tokens=1, mtp_auto_off=False)
    try:
        prompt = list(rt.tokenizer.encode("Write a story about a lighthouse."))
        tokens, finish = generate(rt, prompt, 64)
        gen = stream_generate(model, tokenizer, prompt, max_tokens=64, sampler=make_sampler(0.0))
        assert tokens == [r.token for r in gen]
        assert 0.6 < finish.usage.extra["speculative_acceptance"] < 0.97
    finally:
        rt.engine.shutdown()


def test_never_agreeing_head_is_switched_off(models: dict[str, Path]) -> None:
    rt = runtime(models["never"], num_speculative_tokens=2)
    try:
        prompt = list(rt.tokenizer.encode("Write a story about a lighthouse."))
        _, finish = generate(rt, prompt, 40)
        assert finish.usage.extra["speculative_acceptance"] == 0.0
        assert finish.usage.extra.get("speculative_switched_off") == "slow"
        # Two more such sequences start the cool-down: new sequences then start plain
        # (no speculative round at all), except every 16th, which measures again.
        for _ in range(2):
            _, finish = generate(rt, prompt, 12)
            assert finish.usage.extra.get("speculative_switched_off") == "slow"
        assert rt.engine.decoder.stats()["speculative_cooldown"] == 1.0
        rounds = rt.engine.decoder.stats()["speculative_rounds"]
        speculated = []
        for _ in range(16):
            _, finish = generate(rt, prompt, 12)
            assert finish.usage.extra.get("speculative_switched_off") == "slow"
            speculated.append("speculative_acceptance" in finish.usage.extra)
        assert speculated == [False] * 15 + [True]
        assert rt.engine.decoder.stats()["speculative_rounds"] > rounds  # only the re-probe
    finally:
        rt.engine.shutdown()


def test_a_cool_down_learnt_in_a_batch_covers_a_lone_request(models: dict[str, Path]) -> None:
    from mlxcore.testing.runtime import submit_together

    rt = runtime(models["never"], num_speculative_tokens=2)
    try:
        topics = ("a lighthouse", "a river", "a fox")
        prompts = [tuple(rt.tokenizer.encode(f"Write a story about {t}.")) for t in topics]
        results = submit_together(rt, [GenerationRequest(p, 12) for p in prompts])
        for res in results:  # switched off in a batch of up to three, no draft ever accepted
            assert res.finish is not None
            assert res.finish.usage.extra.get("speculative_switched_off") == "slow"
        assert rt.engine.decoder.stats()["speculative_cooldown"] == 1.0
        rounds = rt.engine.decoder.stats()["speculative_rounds"]
        # acceptance does not depend on the batch: a lone request now starts plain too
        _, finish = generate(rt, list(prompts[0]), 12)
        assert finish.usage.extra.get("speculative_switched_off") == "slow"
        assert "speculative_acceptance" not in finish.usage.extra
        assert rt.engine.decoder.stats()["speculative_rounds"] == rounds
    finally:
        rt.engine.shutdown()
