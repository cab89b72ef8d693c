"""Schemathesis hooks for the contract run (loaded through ``SCHEMATHESIS_HOOKS``).

``accepted_within_model_limits`` is Schemathesis' ``positive_data_acceptance`` less the
refusals a JSON Schema cannot state: a prompt plus ``max_tokens`` beyond the model's
context, ``min_tokens`` above ``max_tokens``, ``top_logprobs`` without ``logprobs``,
``/score``'s ``text_1`` and ``text_2`` lists of different lengths, a transcription's
``timestamp_granularities`` or ``stream`` with a ``response_format`` they do not work
with, ``/tokenize`` without exactly one of ``prompt`` and ``messages``, a route for
another kind of model than the one served (``model_not_supported``: the audio routes on
a chat model), and a constraint the server cannot hold (``invalid_constraint``: a
``tool_choice`` the ``tools`` do not meet, a ``response_format`` schema the
structured-output compiler does not take). Any other refusal of a schema-valid request
still fails the run.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

MODEL_LIMITS = ("context_length_exceeded", "invalid_constraint", "model_not_supported")
"""Codes of refusals that depend on the served model, not on the request's shape."""

RELATIONS = (
    ("min_tokens", "max_tokens"),
    ("top_logprobs", "logprobs"),
    ("text_2", "text_1"),
    ("timestamp_granularities", "verbose_json"),
    ("stream", "response_format"),
)
"""Fields whose allowed values depend on another field's (the second named): the
document says so in prose only."""


ONE_OF = (("prompt", "exactly one of prompt and messages"),)
"""Fields of which a request gives exactly one (``/tokenize``: ``prompt``, its alias
``content``, or ``messages``): (the param the refusal names, its words)."""


ANTHROPIC_LIMITS = (
    "model's context",
    "tool_choice needs tools",
    "not in tools (",
    "at least one tool",
)
"""The words of the same refusals in Anthropic's error shape (which has no code)."""


def _model_limit(body: bytes) -> bool:
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return False
    if not isinstance(error, dict):
        return False
    message = str(error.get("message", ""))
    if error.get("code") in MODEL_LIMITS:
        return True
    for field, other in RELATIONS:
        if error.get("param") == field and other in message:
            return True
    if any(error.get("param") == field and words in message for field, words in ONE_OF):
        return True
    # Anthropic's error shape has no code: its refusals are known by their words
    words = ANTHROPIC_LIMITS
    return error.get("type") == "invalid_request_error" and any(w in message for w in words)


@schemathesis.check
def accepted_within_model_limits(ctx: Any, response: Any, case: Any) -> bool | None:
    """Schema-valid requests are accepted unless they pass the model's limits."""
    if response.status_code == 400 and _model_limit(response.content):
        return None
    return positive_data_acceptance(ctx, response, case)
