"""The generated text is exactly the continuation: the prompt's text followed by the
output's text is the decoding of prompt + output tokens (the first token's leading
space kept), for byte-level BPE (Qwen) and SentencePiece (Gemma) tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxcore.engine.strategies import StepToken
from mlxcore.output import OutputPipeline
from mlxcore.output.detokenize import continuation_detokenizer

SPLITS = [
    ("The capital of France is", " Paris, a city of 2 million people."),
    ("Count:", " one two  three\n four"),
    ("Grüße aus", " 東京 👋🏽 — naïve café."),
    ("def f(x):\n", "    return x  # done"),
    ("no space", "joined"),
]


@pytest.fixture(scope="module", params=["qwen3", "gemma4"])
def tokenizer(request: pytest.FixtureRequest, tiny_qwen3: Path, tiny_gemma4: Path):
    from mlxcore.models.loader import load_model

    return load_model(tiny_qwen3 if request.param == "qwen3" else tiny_gemma4).tokenizer


@pytest.mark.parametrize(("prompt", "continuation"), SPLITS)
def test_prompt_text_plus_output_text_is_the_decoding_of_both(
    tokenizer, prompt: str, continuation: str
) -> None:
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    output_ids = tokenizer.encode(prompt + continuation, add_special_tokens=False)[
        len(prompt_ids) :
    ]
    assert output_ids, "the continuation must add tokens"
    pipe = OutputPipeline(continuation_detokenizer(tokenizer))
    text = "".join(pipe.push([StepToken(t)]).content for t in output_ids)
    text += pipe.finish("stop").content
    whole = tokenizer.decode(prompt_ids + output_ids)
    assert tokenizer.decode(prompt_ids) + text == whole
    if continuation.startswith(" ") and whole.startswith(prompt):
        assert text.startswith(" "), text


def test_mlx_lm_s_own_detokenizer_drops_the_space_this_one_keeps(tokenizer) -> None:
    """The case the continuation detokenizer exists for: mlx-lm's byte-level BPE one
    trims the space (its SentencePiece one trims it unless the tokenizer has no Strip
    step, as Gemma's)."""
    ids = tokenizer.encode("The capital is Paris", add_special_tokens=False)
    first = tokenizer.encode(" Paris", add_special_tokens=False)
    plain, exact = tokenizer.detokenizer, continuation_detokenizer(tokenizer)
    for detok in (plain, exact):
        for t in first:
            detok.add_token(t)
        detok.finalize()
    assert ids[-len(first) :] == first
    assert exact.text == " Paris"
    if type(plain).__name__ == "BPEStreamingDetokenizer":
        assert plain.text == "Paris"


def test_each_call_gives_an_independent_detokenizer(tokenizer) -> None:
    one, two = continuation_detokenizer(tokenizer), continuation_detokenizer(tokenizer)
    for t in tokenizer.encode(" a", add_special_tokens=False):
        one.add_token(t)
    one.finalize()
    assert one.text == " a" and two.text == ""
    assert tokenizer.detokenizer.text == ""
