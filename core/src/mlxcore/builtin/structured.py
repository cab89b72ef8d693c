"""Built-in plugin: enforce ``GenerationRequest.options["constraint"]`` while decoding.

A front end that accepts structured output (OpenAI ``response_format``, ``tool_choice``)
puts a constraint from :mod:`mlxcore.structured` in the request's options; this plugin
gives such a request a logits processor that allows only the tokens the constraint
permits. Requests without the option cost one dictionary look-up.

Options read:

* ``"constraint"``: a :data:`mlxcore.structured.Constraint` (``JsonObject()``,
  ``JsonSchema(schema)``, ``Regex(pattern)``, ``LarkGrammar(text)``);
* ``"constraint_start_after"``: optional text (e.g. ``"</think>"``) that must appear in
  the output before the constraint starts, so a reasoning model can think first;
* ``"constraint_may_open"``: optional text (``"<think>"``): with it the constraint holds
  from the first token unless the output opens with this (one-token) text, and only
  then waits for the start-after text (a model that may or may not think).
"""

from __future__ import annotations

from typing import Any

from mlxcore import hookimpl
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import LogitsProcessor
from mlxcore.model_info import ModelInfo
from mlxcore.structured import (
    MAY_OPEN_OPTION,
    OPTION,
    START_AFTER_OPTION,
    Choice,
    JsonObject,
    JsonSchema,
    LarkGrammar,
    Regex,
    make_processor,
)

_KINDS = (JsonObject, JsonSchema, Regex, LarkGrammar, Choice)


@hookimpl(trylast=True)
def mlxcore_logits_processors(
    request: GenerationRequest, info: ModelInfo
) -> list[LogitsProcessor] | None:
    """The constraint's processor for a request that carries one, else ``None``."""
    constraint = request.options.get(OPTION)
    if constraint is None:
        return None
    if not isinstance(constraint, _KINDS):
        raise TypeError(
            f"options[{OPTION!r}] must be a mlxcore.structured constraint, "
            f"not {type(constraint).__name__}"
        )
    if info.tokenizer is None:
        raise RuntimeError("constrained decoding needs the model's tokenizer (info.tokenizer)")
    start_after = _start_ids(info.tokenizer, request.options.get(START_AFTER_OPTION))
    opener = _start_ids(info.tokenizer, request.options.get(MAY_OPEN_OPTION))
    if opener and len(opener) != 1:
        # only a one-token opener (a special token) can be offered beside the grammar; a
        # model whose tag is plain text cannot open a block: constrained from the start
        start_after, opener = [], []
    return [
        make_processor(
            info.tokenizer,
            constraint,
            prompt_len=len(request.prompt_tokens),
            start_after=start_after,
            may_open=opener[0] if opener else None,
        )
    ]


def _start_ids(tokenizer: Any, text: Any) -> list[int]:
    if not text:
        return []
    if not isinstance(text, str):
        raise TypeError(f"options[{START_AFTER_OPTION!r}] must be a string")
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids
