"""Built-in plugin: hold a request to its thinking budget while decoding.

The request builder puts a :class:`mlxcore.thinking.ThinkingBudget` in
``GenerationRequest.options["thinking_plan"]`` when a request (or the server) sets a
budget and the model has a tag-based reasoning parser; this plugin gives such a request
a :class:`~mlxcore.thinking.ThinkingBudgetProcessor`. Requests without one cost one
dictionary look-up.
"""

from __future__ import annotations

from mlxcore import hookimpl
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import LogitsProcessor
from mlxcore.model_info import ModelInfo
from mlxcore.thinking import OPTION, ThinkingBudget, ThinkingBudgetProcessor


@hookimpl(trylast=True)
def mlxcore_logits_processors(
    request: GenerationRequest, info: ModelInfo
) -> list[LogitsProcessor] | None:
    """The budget's processor for a request that carries one, else ``None``."""
    plan = request.options.get(OPTION)
    if plan is None:
        return None
    if not isinstance(plan, ThinkingBudget):
        raise TypeError(f"options[{OPTION!r}] must be a ThinkingBudget, not {type(plan).__name__}")
    return [ThinkingBudgetProcessor(plan, len(request.prompt_tokens))]
