"""SpecPrefill's sparse prefill on real tiny models: keep 1.0 is exact, kept tokens sit
at their original positions, decoding continues at the full length, prefix reuse; a
position-free Nemotron-H target is its own forward pass over the kept tokens."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
from sp_helpers import drive, masked_reference, prompt_ids

from mlxcore.defaults.chunked_prefill import ChunkedPrefill
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import PrefillTask
from mlxcore_specprefill.options import Settings
from mlxcore_specprefill.scoring import (
    argmax_token,
    score_tokens,
    select_chunks,
    uniform_chunks,
)
from mlxcore_specprefill.sequential import SequentialStack, detect_target, probe_target
from mlxcore_specprefill.stack import TextStack, Unsupported, detect, probe
from mlxcore_specprefill.strategy import SpecPrefill

ARCHS = ["llama", "qwen3", "qwen3_5", "gpt_oss", "nemotron_h"]
DRAFT_ARCH = {"nemotron_h": "llama", "nemotron_h_moe": "llama"}
"""Nemotron-H can be a target only; its tests use the test Llama (same tokenizer) as draft."""
TOL = 2e-4


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024,
}


def make_strategy(
    loaded: Any, arch: str, target_overrides: dict[str, Any] | None = None, **settings: Any
) -> SpecPrefill:
    target, _ = loaded(arch, **(target_overrides or {}))
    draft, _ = loaded(DRAFT_ARCH.get(arch, arch), seed=1)  # same tokenizer, another model
    base = {"threshold": 16, "chunk": 16, "tail": 8, **settings}
    return SpecPrefill(detect_target(target), detect(draft), Settings(**base), step_size=64)


def request(n: int, salt: int = 0) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt_ids(n, salt), max_tokens=4)


@pytest.mark.parametrize("arch", ARCHS)
def test_keep_one_matches_chunked_prefill(loaded: Any, arch: str) -> None:
    model, _ = loaded(arch)
    req = request(200)
    ref_cache = make_prompt_cache(model)
    ref = drive(ChunkedPrefill(model, 64).prefill(PrefillTask(req, ref_cache)))
    sp = make_strategy(loaded, arch, keep=1.0)
    cache = make_prompt_cache(model)
    res = drive(sp.prefill(PrefillTask(req, cache)))
    assert res.usage == {"prompt_tokens_total": 200, "prompt_tokens_kept": 200}
    assert sp.counters.applications == 1
    assert mx.allclose(res.logits, ref.logits, atol=TOL).item()
    # the next decode step agrees too (same cache positions)
    nxt = mx.array([[int(mx.argmax(ref.logits).item())]])
    assert mx.allclose(model(nxt, cache=cache), model(nxt, cache=ref_cache), atol=TOL).item()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt_oss"])
def test_sparse_prefill_places_kept_tokens_at_original_positions(loaded: Any, arch: str) -> None:
    """GPT-OSS also: sliding-window layers mask by position, attention sinks, and the
    last window of real positions is kept (the rotating cache reads it when decoding)."""
    model, _ = loaded(arch)
    req = request(240)
    n = len(req.prompt_tokens)
    sp = make_strategy(loaded, arch, keep=0.2)
    cache = make_prompt_cache(model)
    res = drive(sp.prefill(PrefillTask(req, cache)))
    kept = sp.last_kept
    assert kept[-1] == n - 1 and kept[0] == 0
    assert res.usage == {"prompt_tokens_total": n, "prompt_tokens_kept": len(kept)}
    assert len(kept) < n // 3 and res.reusable is False
    assert all(c.offset == len(kept) for c in cache)  # the cache holds only kept entries
    window = sp.target.window
    if window:
        assert window == 8 and set(range(n - window, n)) <= set(kept)
    # dense reference: every query sees only kept keys, all at true positions 0..n
    nxt = int(mx.argmax(res.logits).item())
    ref = masked_reference(model, [*req.prompt_tokens, nxt], kept)
    assert mx.allclose(res.logits[0], ref[n - 1], atol=TOL).item()
    # decoding continues at position n (then n + 1), not at len(kept)
    step1 = model(mx.array([[nxt]]), cache=cache)[0, -1]
    assert mx.allclose(step1, ref[n], atol=TOL).item()
    nxt2 = int(mx.argmax(step1).item())
    ref2 = masked_reference(model, [*req.prompt_tokens, nxt, nxt2], [*kept, n])
    step2 = model(mx.array([[nxt2]]), cache=cache)[0, -1]
    assert mx.allclose(step2, ref2[n + 1], atol=TOL).item()


def test_hybrid_sparse_prefill_matches_unshifted_positions(loaded: Any) -> None:
    """Qwen3.5: GatedDeltaNet layers read the kept tokens in order; the attention
    layers' shifted positions give the same logits as the true positions would."""
    model, _ = loaded("qwen3_5")
    req = request(240)
    n = len(req.prompt_tokens)
    sp = make_strategy(loaded, "qwen3_5", keep=0.2)
    cache = make_prompt_cache(model)
    res = drive(sp.prefill(PrefillTask(req, cache)))
    kept = sp.last_kept
    assert 0 < len(kept) < n // 3 and res.reusable is False
    nxt = int(mx.argmax(res.logits).item())
    step = model(mx.array([[nxt]]), cache=cache)[0, -1]
    # reference: the same kept tokens at their true positions, decode at position n
    stack = sp.target
    ref_cache = make_prompt_cache(model)
    ids = mx.array([req.prompt_tokens[p] for p in kept] + [nxt])[None]
    h = stack.forward(ids, mx.array([*kept, n]), ref_cache)
    inner = model.language_model.model
    ref = inner.embed_tokens.as_linear(inner.norm(h))[0]
    assert mx.allclose(res.logits[0], ref[-2], atol=TOL).item()
    assert mx.allclose(step, ref[-1], atol=TOL).item()


@pytest.mark.parametrize("scaling", [None, YARN, LLAMA3], ids=["plain", "yarn", "llama3"])
def test_prefix_reuse_sparse_prefills_only_the_new_part(
    loaded: Any, scaling: dict[str, Any] | None
) -> None:
    """The reused prefix is re-rotated to the shifted positions (YaRN's input scale
    divided back out) and only the new part is thinned."""
    overrides = {} if scaling is None else {"rope_scaling": scaling}
    model, _ = loaded("llama", **overrides)
    req = request(260)
    n, start = len(req.prompt_tokens), 100
    cache = make_prompt_cache(model)
    model(mx.array([req.prompt_tokens[:start]]), cache=cache)  # the reused prefix
    sp = make_strategy(loaded, "llama", overrides, keep=0.25)
    res = drive(sp.prefill(PrefillTask(req, cache, start=start)))
    kept = sp.last_kept
    assert kept[0] >= start and kept[-1] == n - 1
    assert res.usage == {"prompt_tokens_total": n, "prompt_tokens_kept": start + len(kept)}
    nxt = int(mx.argmax(res.logits).item())
    ref = masked_reference(model, [*req.prompt_tokens, nxt], [*range(start), *kept])
    assert mx.allclose(res.logits[0], ref[n - 1], atol=TOL).item()
    step = model(mx.array([[nxt]]), cache=cache)[0, -1]
    assert mx.allclose(step, ref[n], atol=TOL).item()


def test_below_threshold_or_disabled_is_plain_chunked_prefill(loaded: Any) -> None:
    model, _ = loaded("llama")
    sp = make_strategy(loaded, "llama", threshold=1000)
    res = drive(sp.prefill(PrefillTask(request(200), make_prompt_cache(model))))
    assert res.usage == {} and res.reusable and sp.counters.applications == 0
    off = GenerationRequest(
        prompt_tokens=prompt_ids(200), max_tokens=4, options={"specprefill": {"enabled": False}}
    )
    sp = make_strategy(loaded, "llama")
    res = drive(sp.prefill(PrefillTask(off, make_prompt_cache(model))))
    assert res.usage == {} and sp.counters.applications == 0


def test_error_falls_back_to_full_prefill(loaded: Any, caplog: pytest.LogCaptureFixture) -> None:
    model, _ = loaded("llama")
    sp = make_strategy(loaded, "llama", keep=0.2)
    logger = logging.getLogger("mlxcore.plugins.specprefill")
    logger.addHandler(caplog.handler)  # robust to "mlxcore" not propagating to root

    class Broken(TextStack):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("boom")

    sp.target = Broken(**attrs.asdict(sp.target, recurse=False))
    req = request(200)
    ref = drive(ChunkedPrefill(model, 64).prefill(PrefillTask(req, make_prompt_cache(model))))
    try:
        res = drive(sp.prefill(PrefillTask(req, make_prompt_cache(model))))
    finally:
        logger.removeHandler(caplog.handler)
    assert sp.counters.errors == 1 and res.usage == {} and res.reusable
    assert mx.allclose(res.logits, ref.logits, atol=TOL).item()
    assert "falling back to chunked prefill" in caplog.text


def test_unsupported_structure_is_refused_with_a_reason(loaded: Any) -> None:
    model, _ = loaded("gemma4_text")
    with pytest.raises(Unsupported, match="pre_feedforward_layernorm"):
        detect_target(model)
    nemotron, _ = loaded("nemotron_h")
    with pytest.raises(Unsupported, match="Nemotron-H"):
        detect(nemotron)  # no draft: its attention cannot be read through a TextStack
    target = detect_target(nemotron)  # but a target: no positions anywhere
    assert isinstance(target, SequentialStack)
    assert target.kinds == ["recurrent", "attention", "feed-forward"]
    probe_target(target)
    probe(detect(loaded("qwen3_5")[0]))  # supported ones pass the numeric self-check
    dynamic = {"rope_type": "dynamic", "factor": 2.0}
    with pytest.raises(Unsupported, match="composed forward"):
        probe(detect(loaded("llama", rope_scaling=dynamic)[0]))


class _HiddenRoPEAttention(nn.Module):
    """Nemotron-H's attention with RoPE applied by a bare ``mx.fast.rope`` call: no
    module to see, so only the numeric order probe can tell."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.q_proj, self.k_proj = inner.q_proj, inner.k_proj
        self.v_proj, self.o_proj = inner.v_proj, inner.o_proj
        self.heads, self.kv_heads, self.scale = (
            inner.num_heads,
            inner.num_key_value_heads,
            inner.scale,
        )

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        B, L, _ = x.shape
        offset = cache.offset if cache is not None else 0

        def split(t: mx.array, heads: int) -> mx.array:
            return t.reshape(B, L, heads, -1).transpose(0, 2, 1, 3)

        q = split(self.q_proj(x), self.heads)
        k, v = split(self.k_proj(x), self.kv_heads), split(self.v_proj(x), self.kv_heads)
        q = mx.fast.rope(q, q.shape[-1], traditional=False, base=10000.0, scale=1.0, offset=offset)
        k = mx.fast.rope(k, k.shape[-1], traditional=False, base=10000.0, scale=1.0, offset=offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def test_nemotron_h_with_positions_is_refused(nemotron_h_path: Path) -> None:
    """A ``rope`` module on an attention mixer is refused by structure; a rotation
    hidden in the mixer's code is caught by the order probe."""
    model = load(str(nemotron_h_path))[0]  # a private copy: its blocks are edited
    attn = model.layers[1].mixer
    attn.rope = nn.RoPE(16)
    with pytest.raises(Unsupported, match="rope"):
        detect_target(model)
    del attn["rope"]
    model.layers[1].mixer = _HiddenRoPEAttention(attn)
    stack = detect_target(model)
    with pytest.raises(Unsupported, match="depends on token order"):
        probe_target(stack)


def test_select_chunks_keeps_head_tail_and_best() -> None:
    scores = [0.0] * 100
    scores[40:50] = [1.0] * 10
    kept = select_chunks(scores, 0, keep=0.3, chunk=10, tail=8)
    assert kept == [*range(0, 10), *range(40, 50), *range(90, 100)]
    assert select_chunks(scores, 0, keep=1.0, chunk=7, tail=8) == list(range(100))
    assert select_chunks(scores, 30, keep=0.2, chunk=10, tail=8)[0] >= 30
    uniform = uniform_chunks(100, 0, keep=0.3, chunk=10, tail=8)
    assert len(uniform) == 30 and uniform[-1] == 99


def _mlx_lm_greedy(model: Any, tokens: tuple[int, ...], count: int) -> list[int]:
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(list(tokens)), model, max_tokens=count)
    return [int(tok) for tok, _ in steps]


def test_draft_lookahead_tokens_score_like_an_extended_prompt(loaded: Any) -> None:
    """The draft's decoded lookahead tokens act as queries exactly as if they had
    been part of the prompt (its cache is trimmed back and re-run correctly)."""
    draft, _ = loaded("llama", seed=1)
    stack = detect(draft)
    tokens = prompt_ids(150, salt=3)
    generated = _mlx_lm_greedy(draft, tokens, 3)
    with_decode = drive(score_tokens(stack, tokens, 4, 64, decode=3))
    extended = drive(score_tokens(stack, (*tokens, *generated), 7, 64, decode=0))
    prompt_only = drive(score_tokens(stack, tokens, 4, 64, decode=0))
    assert with_decode.shape == (150,)
    assert mx.allclose(with_decode, extended[:150], atol=1e-5).item()
    assert not mx.allclose(with_decode, prompt_only, atol=1e-5).item()


def test_recurrent_draft_scores_from_prompt_positions_only(loaded: Any) -> None:
    """A hybrid draft's recurrent state cannot be rolled back: no lookahead decode."""
    stack = detect(loaded("qwen3_5", seed=1)[0])
    tokens = prompt_ids(100, salt=4)
    a = drive(score_tokens(stack, tokens, 4, 64, decode=3))
    b = drive(score_tokens(stack, tokens, 4, 64, decode=0))
    assert mx.allclose(a, b).item() and float(a.sum().item()) > 0


def test_sliding_window_target_with_a_reused_prefix_falls_back(loaded: Any) -> None:
    """Rotating caches hold only a window of the prefix: no sparse prefill on top."""
    model, _ = loaded("gpt_oss")
    sp = make_strategy(loaded, "gpt_oss", keep=0.2)
    req = request(200, salt=6)
    ref = drive(ChunkedPrefill(model, 64).prefill(PrefillTask(req, make_prompt_cache(model))))
    cache = make_prompt_cache(model)
    drive(
        ChunkedPrefill(model, 64).prefill(
            PrefillTask(attrs.evolve(req, prompt_tokens=req.prompt_tokens[:120]), cache)
        )
    )
    res = drive(sp.prefill(PrefillTask(req, cache, 120)))
    assert sp.counters.fallbacks == 1 and sp.counters.applications == 0
    assert res.usage == {} and mx.allclose(res.logits, ref.logits, atol=TOL).item()


def _plain_logits(model: Any, tokens: list[int], cache: list[Any]) -> mx.array:
    return model(mx.array([tokens], dtype=mx.int32), cache=cache)[0, -1]


@pytest.mark.parametrize("arch", ["nemotron_h", "nemotron_h_moe"])
def test_nemotron_h_sparse_prefill_is_its_forward_pass_over_the_kept_tokens(
    loaded: Any, arch: str
) -> None:
    """No positions: the sparse prefill equals feeding exactly the kept tokens to the
    model (in order), and decoding continues identically from both caches (MLP and
    routed MoE feed-forward blocks)."""
    model, _ = loaded(arch)
    req = request(400, salt=11)
    n = len(req.prompt_tokens)
    sp = make_strategy(loaded, arch, keep=0.2)
    cache = make_prompt_cache(model)
    gen = sp.prefill(PrefillTask(req, cache))
    progress: list[int] = []
    while True:
        try:
            progress.append(next(gen))
        except StopIteration as stop:
            res = stop.value
            break
    kept = sp.last_kept
    assert kept[0] == 0 and kept[-1] == n - 1 and len(kept) < n // 3
    # the kept tokens went through the target in chunks of 64, yielding in between
    assert [p for p in progress if p > 0] == [64, len(kept) - 1]
    assert res.usage == {"prompt_tokens_total": n, "prompt_tokens_kept": len(kept)}
    assert res.reusable is False
    assert all(c.offset == len(kept) for c in cache if hasattr(c, "offset"))
    ref_cache = make_prompt_cache(model)
    ref = _plain_logits(model, [req.prompt_tokens[p] for p in kept], ref_cache)
    assert mx.allclose(res.logits[0], ref, atol=TOL).item()
    full = _plain_logits(model, list(req.prompt_tokens), make_prompt_cache(model))
    assert not mx.allclose(res.logits[0], full, atol=1e-2).item()  # tokens were dropped
    nxt = argmax_token(ref[None])
    for _ in range(2):  # two decode steps from each cache
        step = _plain_logits(model, [nxt], cache)
        expected = _plain_logits(model, [nxt], ref_cache)
        assert mx.allclose(step, expected, atol=TOL).item()
        nxt = argmax_token(expected[None])


def test_nemotron_h_prefix_reuse_appends_the_kept_new_tokens(loaded: Any) -> None:
    model, _ = loaded("nemotron_h")
    req = request(260, salt=12)
    n, start = len(req.prompt_tokens), 100
    cache = make_prompt_cache(model)
    model(mx.array([req.prompt_tokens[:start]]), cache=cache)  # the reused prefix
    sp = make_strategy(loaded, "nemotron_h", keep=0.25)
    res = drive(sp.prefill(PrefillTask(req, cache, start=start)))
    kept = sp.last_kept
    assert kept[0] >= start and kept[-1] == n - 1 and len(kept) < (n - start) // 2
    assert res.usage == {"prompt_tokens_total": n, "prompt_tokens_kept": start + len(kept)}
    tokens = [*req.prompt_tokens[:start], *(req.prompt_tokens[p] for p in kept)]
    ref_cache = make_prompt_cache(model)
    ref = _plain_logits(model, tokens, ref_cache)
    assert mx.allclose(res.logits[0], ref, atol=TOL).item()
    nxt = argmax_token(ref[None])
    step = _plain_logits(model, [nxt], cache)
    assert mx.allclose(step, _plain_logits(model, [nxt], ref_cache), atol=TOL).item()
