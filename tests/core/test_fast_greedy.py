"""The plain decoder's greedy fast path: argmax of the raw logits, with mlx-lm's exact
normalised pick for rows where rounding could make a difference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxcore.defaults.decoder import PlainDecoder
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.engine.row_sampling import NEAR_TIE, exact_greedy, near_ties
from mlxcore.engine.sampling import greedy
from mlxcore.engine.strategies import DecodeSequence, is_stateless, stateless


def settled(logits: mx.array) -> list[int]:
    decoder = PlainDecoder(model=None)
    decoder._pending = mx.argmax(logits, axis=-1)
    decoder._unchecked = (logits, near_ties(logits))
    decoder._settle()
    return decoder._pending.tolist()


def test_a_tie_made_by_rounding_takes_the_exact_pick() -> None:
    vocab = 151_669
    row = mx.zeros((vocab,))  # logsumexp ~ 11.9: results near -11.8, where an ulp is ~1e-6
    row[7] = 0.1
    row[3] = 0.1 - 5e-8  # smaller, but equal to the largest after the subtraction
    logits = row[None]
    assert mx.argmax(logits, axis=-1).item() == 7
    exact = exact_greedy(logits).item()
    assert exact == 3, "the rounding tie this test needs did not happen"
    assert near_ties(logits).tolist() == [True]
    assert settled(logits) == [exact] != [7]
    decoder = PlainDecoder(model=None)
    decoder._pending = mx.argmax(logits, axis=-1)
    decoder._unchecked = (logits, near_ties(logits))
    decoder._settle()
    assert decoder.stats()["greedy_exact_fallbacks"] == 1


def test_unflagged_rows_agree_with_the_exact_pick() -> None:
    mx.random.seed(3)
    for scale in (0.01, 1.0, 30.0):
        logits = mx.random.normal((64, 50_000)) * scale
        flags = near_ties(logits).tolist()
        fast = mx.argmax(logits, axis=-1).tolist()
        exact = exact_greedy(logits).tolist()
        for f, a, b in zip(flags, fast, exact, strict=True):
            assert f or a == b
        assert settled(logits) == exact


def test_the_threshold_covers_float32_rounding_near_log_vocab() -> None:
    # results of logits - logsumexp lie within log(vocab) < 32 of zero: one ulp there
    assert NEAR_TIE > 2 * 2.0**-19


class RoundingTies:
    """A real model whose rows fed a multiple of 3 get logits with a rounding tie: two
    logits 5e-8 apart, so the raw argmax takes the larger (:data:`LARGER`) and mlx-lm's
    normalised pick the earlier, equal after rounding (:data:`SMALLER`)."""

    SMALLER, LARGER = 301, 302  # 301 is no multiple of 3: the next step is the model's own

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layers = model.layers

    def __getattr__(self, name: str) -> Any:  # make_cache and the like: the model's own
        return getattr(self.model, name)

    def __call__(self, inputs: mx.array, cache: Any = None, **kwargs: Any) -> mx.array:
        logits = self.model(inputs, cache=cache, **kwargs)
        row = mx.zeros((logits.shape[-1],), dtype=logits.dtype)
        row[self.LARGER] = 0.1
        row[self.SMALLER] = 0.1 - 5e-8
        return mx.where((inputs % 3 == 0)[..., None], row, logits)


def decode_with_ties(
    model_path: Path,
    steps: int = 40,
    processors: Callable[[], list[Any]] = list,
) -> dict[str, int]:
    """Three rows of greedy decoding on ``model_path`` with rounding ties, checked against
    mlx-lm's ``stream_generate`` token for token (each row and each mlx-lm run with its own
    ``processors()``); returns the decoder's stats."""
    from mlx_lm import load, stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = load(str(model_path))
    tying = RoundingTies(model)
    tie = tying(mx.array([[3]]))[0, -1][None]
    assert mx.argmax(tie, axis=-1).item() == RoundingTies.LARGER
    assert exact_greedy(tie).item() == RoundingTies.SMALLER, "the rounding tie did not happen"

    prompts = [[1000 + 17 * i + j for j in range(9)] for i in range(3)]
    decoder = PlainDecoder(tying)
    firsts = []
    for uid, prompt in enumerate(prompts):
        cache = make_prompt_cache(tying)
        first = exact_greedy(tying(mx.array(prompt)[None], cache=cache)[:, -1, :]).item()
        firsts.append(first)
        request = GenerationRequest(tuple(prompt), steps, sampling=SamplingParams())
        seq = DecodeSequence(uid, request, cache, [*prompt, first], first, greedy, processors())
        decoder.add(seq)
    got: dict[int, list[int]] = {uid: [first] for uid, first in enumerate(firsts)}
    for _ in range(steps):
        for uid, tokens in decoder.step().items():
            got[uid] += [t.token for t in tokens]
    for uid, prompt in enumerate(prompts):
        runs = stream_generate(tying, tokenizer, prompt, steps, logits_processors=processors())
        expected = [r.token for r in runs]
        assert got[uid][:steps] == expected
    return decoder.stats()


def test_a_step_launched_before_its_input_was_checked_is_launched_again_on_a_tie(
    tiny_qwen3: Path,
) -> None:
    """The fast path launches a step on the raw argmax before checking the last step's near
    ties; where the exact pick differs, the step's token is taken back from the batch cache
    and the step launched again: every row's tokens stay mlx-lm's."""
    stats = decode_with_ties(tiny_qwen3)
    assert stats["greedy_exact_fallbacks"] > 0 and stats["greedy_relaunched_steps"] > 0, stats


def test_recurrent_layers_settle_each_step_before_the_next(tiny_qwen3_5: Path) -> None:
    """A hybrid model's linear-attention state cannot take a token back: its steps wait for
    the last step's check instead of launching early, and the tokens stay mlx-lm's."""
    stats = decode_with_ties(tiny_qwen3_5)
    assert stats["greedy_exact_fallbacks"] > 0 and stats["greedy_relaunched_steps"] == 0, stats


def test_stateless_processors_keep_the_step_launched_before_the_check(tiny_qwen3: Path) -> None:
    """mlx-lm's penalties are functions of their arguments alone (marked stateless): rows
    with them still launch before the check, are launched again on a tie, and their tokens
    stay mlx-lm's with the same processors."""
    from mlx_lm.sample_utils import make_logits_processors

    def penalties() -> list[Any]:
        made = make_logits_processors(repetition_penalty=1.3, frequency_penalty=0.5)
        return [stateless(p) for p in made]

    assert all(is_stateless(p) for p in penalties())
    stats = decode_with_ties(tiny_qwen3, processors=penalties)
    assert stats["greedy_exact_fallbacks"] > 0 and stats["greedy_relaunched_steps"] > 0, stats


class Recorder:
    """A stateful processor: records each context it is shown (length, last token)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self.seen.append((len(tokens), int(tokens[-1].item())))
        return logits


def test_a_stateful_processor_sees_only_checked_tokens(tiny_qwen3: Path) -> None:
    """A processor that keeps state must never see a token a near tie's check replaces:
    its rows build the forward pass first and call it after the check (nothing is
    launched twice), every context it sees is one position longer than the last, and the
    tokens stay mlx-lm's."""
    recorders: list[Recorder] = []

    def recording() -> list[Any]:
        recorders.append(Recorder())
        return [recorders[-1]]

    stats = decode_with_ties(tiny_qwen3, processors=recording)
    assert stats["greedy_exact_fallbacks"] > 0 and stats["greedy_relaunched_steps"] == 0, stats
    ours = recorders[:3]  # the decoder's rows; mlx-lm's runs made the rest
    for recorder in ours:
        lengths = [n for n, _ in recorder.seen]
        assert lengths == list(range(lengths[0], lengths[0] + len(lengths))), lengths
    # the contexts the decoder showed are mlx-lm's (same tokens at every position)
    for mine, theirs in zip(ours, recorders[3:], strict=True):
        shared = {n: t for n, t in theirs.seen}
        assert all(shared.get(n, t) == t for n, t in mine.seen)
