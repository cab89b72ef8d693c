"""The lazy tool-call processor on the real tiny Qwen3 tokenizer and real llguidance:
free text passes untouched, an opener starts the call grammar, the closer frees the
text again, rollbacks undo exactly what they take back, and reasoning gates openers."""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx
import pytest

from mlxcore.parsers.qwen import HermesToolParser
from mlxcore.structured import LarkGrammar, compiled_tokenizer, make_processor
from mlxcore.structured.call_grammar import special_token_finder, tool_call_grammar
from mlxcore.structured.lazy_tools import LazyToolCallProcessor, make_lazy_processor
from mlxcore.testing.conformance import loaded_test_model
from mlxcore.testing.tool_call_cases import TOOLS
from mlxcore_minimax import MiniMaxM2ToolParser

PROMPT = [1, 2, 3]
CALL = '\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return loaded_test_model("qwen3").tokenizer


def _special(tokenizer: Any) -> Any:
    return special_token_finder(tokenizer, compiled_tokenizer(tokenizer).ll.is_special_token)


def _processor(tokenizer: Any, **kwargs: Any) -> LazyToolCallProcessor:
    parallel = kwargs.pop("parallel", True)
    lazy = tool_call_grammar(
        HermesToolParser.call_grammar, TOOLS, _special(tokenizer), parallel=parallel
    )
    lazy = attrs.evolve(lazy, in_reasoning=kwargs.pop("in_reasoning", None))
    return make_lazy_processor(tokenizer, lazy, prompt_len=len(PROMPT), **kwargs)


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _logits(tokenizer: Any) -> mx.array:
    return mx.zeros((1, compiled_tokenizer(tokenizer).vocab_size))


def _allowed(out: mx.array) -> int:
    return int(mx.sum(out > -mx.inf).item())


def _feed(proc: LazyToolCallProcessor, tokens: list[int], logits: mx.array) -> mx.array:
    return proc(mx.array(PROMPT + tokens), logits)


def test_free_text_is_untouched_and_a_call_is_constrained(tokenizer: Any) -> None:
    proc = _processor(tokenizer)
    logits = _logits(tokenizer)
    opener, closer = _ids(tokenizer, "<tool_call>"), _ids(tokenizer, "</tool_call>")
    text = _ids(tokenizer, "Let me check.")
    assert _feed(proc, text, logits) is logits  # no mask, not even a copy
    out = _feed(proc, text + opener, logits)
    assert proc.active and _allowed(out) < 10  # the newline the format writes first
    body = _ids(tokenizer, CALL)
    for i in range(1, len(body) + 1):
        out = _feed(proc, text + opener + body[:i], logits)
        assert proc.active
    assert _allowed(out) == 1 and out[0, closer[0]].item() == 0.0
    after = text + opener + body + closer
    assert _feed(proc, after, logits) is logits and not proc.active
    assert _feed(proc, after + _ids(tokenizer, " Done."), logits) is logits
    out = _feed(proc, after + _ids(tokenizer, " Done.") + opener, logits)  # another call
    assert proc.active and len(proc.calls) == 2


def test_the_grammar_refuses_bad_arguments_by_mask(tokenizer: Any) -> None:
    proc = _processor(tokenizer)
    logits = _logits(tokenizer)
    prefix = _ids(tokenizer, "<tool_call>") + _ids(
        tokenizer, '\n{"name": "get_weather", "arguments": {"city": "P", "unit": "'
    )
    out = _feed(proc, prefix, logits)
    allowed = {i for i in range(out.shape[-1]) if out[0, i].item() > -mx.inf}
    assert _ids(tokenizer, "c")[0] in allowed or _ids(tokenizer, "cel")[0] in allowed
    assert _ids(tokenizer, "k")[0] not in allowed
    assert tokenizer.eos_token_ids.isdisjoint(allowed)  # no ending inside a call


def test_one_call_only_bans_the_opener_after_it(tokenizer: Any) -> None:
    proc = _processor(tokenizer, parallel=False)
    logits = _logits(tokenizer)
    opener, closer = _ids(tokenizer, "<tool_call>"), _ids(tokenizer, "</tool_call>")
    before = _feed(proc, _ids(tokenizer, "ok"), logits)
    assert before[0, opener[0]].item() == 0.0
    out = _feed(proc, _ids(tokenizer, "ok") + opener + _ids(tokenizer, CALL) + closer, logits)
    assert not proc.active and out[0, opener[0]].item() == -mx.inf
    assert _allowed(out) == out.shape[-1] - 1


def test_rollbacks_undo_what_they_take_back(tokenizer: Any) -> None:
    proc = _processor(tokenizer)
    logits = _logits(tokenizer)
    opener, closer = _ids(tokenizer, "<tool_call>"), _ids(tokenizer, "</tool_call>")
    body = _ids(tokenizer, CALL)
    text = _ids(tokenizer, "Hi")
    full = text + opener + body + closer
    _feed(proc, full, logits)
    assert not proc.active
    _feed(proc, full[:-3], logits)  # back inside the call
    assert proc.active
    redo = _feed(proc, full[:-1], logits)
    assert proc.active and _allowed(redo) == 1
    _feed(proc, full, logits)
    assert not proc.active and len(proc.calls) == 1
    assert _feed(proc, text, logits) is logits and not proc.calls  # before the opener
    _feed(proc, text + opener + body[:2], logits)  # a different path works after it
    assert proc.active and len(proc.calls) == 1


def test_a_text_opener_split_across_tokens_starts_the_call(tokenizer: Any) -> None:
    """MiniMax's opener is text in the Qwen3 vocabulary: several tokens, the last of
    which may go on past it."""
    lazy = tool_call_grammar(MiniMaxM2ToolParser.call_grammar, TOOLS, _special(tokenizer))
    proc = make_lazy_processor(tokenizer, lazy, prompt_len=len(PROMPT))
    assert proc.opener_token is None
    logits = _logits(tokenizer)
    text = 'Sure.<minimax:tool_call>\n<invoke name="get_weather">\n'
    ids = _ids(tokenizer, text)
    for i in range(1, len(ids)):
        _feed(proc, ids[:i], logits)
        if tokenizer.decode(ids[:i]).find("<minimax:tool_call>") < 0:
            assert not proc.active
    _feed(proc, ids, logits)
    assert proc.active
    rest = (
        '<parameter name="city">Paris</parameter>\n'
        '<parameter name="unit">celsius</parameter>\n</invoke>\n</minimax:tool_call>'
    )
    more = _ids(tokenizer, rest)
    for i in range(1, len(more) + 1):
        _feed(proc, ids + more[:i], logits)
    assert not proc.active and proc.calls[-1].done


def test_openers_inside_reasoning_wait_for_its_end(tokenizer: Any) -> None:
    proc = _processor(tokenizer, after="</think>", may_open="<think>")
    logits = _logits(tokenizer)
    think, end = _ids(tokenizer, "<think>"), _ids(tokenizer, "</think>")
    opener = _ids(tokenizer, "<tool_call>")
    reasoning = think + _ids(tokenizer, "maybe") + opener
    _feed(proc, reasoning, logits)
    assert not proc.active  # a call mentioned while thinking
    _feed(proc, reasoning + end + _ids(tokenizer, "\n\n") + opener, logits)
    assert proc.active


def test_a_line_start_opener_ends_reasoning_where_the_parser_says(tokenizer: Any) -> None:
    proc = _processor(tokenizer, after="</think>", may_open="<think>", in_reasoning="line")
    logits = _logits(tokenizer)
    think, opener = _ids(tokenizer, "<think>"), _ids(tokenizer, "<tool_call>")
    _feed(proc, think + _ids(tokenizer, "maybe") + opener, logits)
    assert not proc.active  # mid-line: a mention
    proc = _processor(tokenizer, after="</think>", may_open="<think>", in_reasoning="line")
    _feed(proc, think + _ids(tokenizer, "plan:\n") + opener, logits)
    assert proc.active
    proc = _processor(tokenizer, after="</think>", in_reasoning="line")  # the prompt opened it
    _feed(proc, _ids(tokenizer, "\n") + opener, logits)
    assert proc.active


def test_a_forced_choice_may_start_inside_reasoning_at_the_exit_token(tokenizer: Any) -> None:
    forced = tool_call_grammar(
        HermesToolParser.call_grammar, TOOLS, _special(tokenizer), mode="required"
    )
    opener = _ids(tokenizer, "<tool_call>")
    proc = make_processor(
        tokenizer,
        LarkGrammar(forced.grammar.grammar),
        prompt_len=len(PROMPT),
        start_after=_ids(tokenizer, "</think>"),
        exit_token=opener[0],
    )
    logits = _logits(tokenizer)
    assert proc(mx.array(PROMPT + _ids(tokenizer, "hmm")), logits) is logits
    proc(mx.array(PROMPT + _ids(tokenizer, "hmm\n") + opener), logits)
    assert proc.active


def test_a_difference_far_back_is_found(tokenizer: Any) -> None:
    """A context that differs before the last 64 output tokens (compared first) is still
    rolled back to where it differs: the call whose opener changed is gone."""
    proc = _processor(tokenizer)
    logits = _logits(tokenizer)
    opener, closer = _ids(tokenizer, "<tool_call>"), _ids(tokenizer, "</tool_call>")
    call = opener + _ids(tokenizer, CALL) + closer
    filler = _ids(tokenizer, " word" * 80)
    _feed(proc, call + filler, logits)
    assert len(proc.calls) == 1 and not proc.active
    _feed(proc, _ids(tokenizer, "no call") + filler, logits)
    assert not proc.calls and len(proc.generated) == len(_ids(tokenizer, "no call") + filler)
    _feed(proc, _ids(tokenizer, "no call") + filler + opener, logits)
    assert proc.active
