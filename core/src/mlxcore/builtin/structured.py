"""Built-in plugin: enforce ``GenerationRequest.options["constraint"]`` while decoding.

A front end that accepts structured output (OpenAI ``response_format``, ``tool_choice``)
puts a constraint from :mod:`mlxcore.structured` in the request's options; this plugin
gives such a request a logits processor that allows only the tokens the constraint
permits. Requests without the option cost one dictionary look-up.

Options read:

* ``"constraint"``: a :data:`mlxcore.structured.Constraint` (``JsonObject()``,
  ``JsonSchema(schema)``, ``Regex(pattern)``, ``LarkGrammar(text)``, or a
  ``LazyToolGrammar`` that holds only inside tool calls);
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
    EXIT_OPTION,
    MAY_OPEN_OPTION,
    OPTION,
    START_AFTER_OPTION,
    Choice,
    JsonObject,
    JsonSchema,
    LarkGrammar,
    LazyToolGrammar,
    Regex,
    make_processor,
)
from mlxcore.structured.lazy_tools import make_lazy_processor

_KINDS = (JsonObject, JsonSchema, Regex, LarkGrammar, Choice, LazyToolGrammar)


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
    if isinstance(constraint, LazyToolGrammar):
        after = request.options.get(START_AFTER_OPTION)
        return [
            make_lazy_processor(
                info.tokenizer,
                constraint,
                prompt_len=len(request.prompt_tokens),
                after=after if isinstance(after, str) else None,
                may_open=request.options.get(MAY_OPEN_OPTION),
            )
        ]
    start_after = _start_ids(info.tokenizer, request.options.get(START_AFTER_OPTION))
    opener = _start_ids(info.tokenizer, request.options.get(MAY_OPEN_OPTION))
    if opener and len(opener) != 1:
        # only a one-token opener (a special token) can be offered beside the grammar; a
        # model whose tag is plain text cannot open a block: constrained from the start
        start_after, opener = [], []
    exit_token, exit_anywhere = None, False
    found = request.options.get(EXIT_OPTION)
    if found is not None and start_after:
        ids = _start_ids(info.tokenizer, found[0])
        exit_token = ids[0] if len(ids) == 1 else None
        exit_anywhere = found[1] == "anywhere"
    return [
        make_processor(
            info.tokenizer,
            constraint,
            prompt_len=len(request.prompt_tokens),
            start_after=start_after,
            may_open=opener[0] if opener else None,
            exit_token=exit_token,
            exit_anywhere=exit_anywhere,
        )
    ]


def _start_ids(tokenizer: Any, text: Any) -> list[int]:
    if not text:
        return []
    if not isinstance(text, str):
        raise TypeError(f"options[{START_AFTER_OPTION!r}] must be a string")
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids
