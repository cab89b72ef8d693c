"""One check of every generation setting against the model, before anything reaches MLX.

Every front end (OpenAI chat and completions, Anthropic messages, the CLI, whatever
comes next) builds a :class:`~mlxcore.engine.request.GenerationRequest`; the engine
runs :func:`check_request` on it when it is submitted, so a value no front end
thought of is still refused with a message naming the field, not turned into an
MLX error on the engine thread. Front ends keep their own API's documented ranges
(OpenAI's temperature up to 2, Anthropic's up to 1); this module holds what any
request must satisfy for the model to run it at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.errors import MlxcoreError

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's limit)."""

MAX_STOPS = 16
"""The most stop strings one request may give (every route)."""

MAX_STOP_CHARS = 1024
"""The longest stop string accepted."""

MAX_TEMPERATURE = 100.0
"""Above this, sampling is uniform noise; front ends have tighter documented ranges."""

MAX_PENALTY = 100.0
"""Bound on the magnitude of presence / frequency penalties and logit biases."""


class RequestRejected(MlxcoreError):
    """A request that can never be served as given (HTTP 400).

    Attributes:
        field: the request field at fault (``top_k``, ``max_tokens``, ``messages``...),
            or ``None`` when no single field is.
        code: a machine-readable code for the API's error body, or ``None``.
    """

    def __init__(self, message: str, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.code = code


@attrs.frozen
class ModelLimits:
    """What a request is checked against.

    Attributes:
        vocab_size: the number of token ids the model's output layer scores.
        context: the most tokens a sequence may hold (``None``: no limit known).
        memory_context: the most tokens one sequence's cache can hold in the memory
            budget (``None``: no limit known).
    """

    vocab_size: int
    context: int | None = None
    memory_context: int | None = None


def _finite(field: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise RequestRejected(f"{field} must be a finite number, got {value}", field)


def _between(field: str, value: float | None, low: float, high: float) -> None:
    _finite(field, value)
    if value is not None and not low <= value <= high:
        raise RequestRejected(f"{field} must be between {low} and {high}, got {value}", field)


def check_sampling(params: SamplingParams, vocab_size: int) -> None:
    """Refuse sampling settings the samplers cannot honour (:class:`RequestRejected`)."""
    _between("temperature", params.temperature, 0.0, MAX_TEMPERATURE)
    _finite("top_p", params.top_p)
    if not 0.0 < params.top_p <= 1.0:
        raise RequestRejected(f"top_p must be in (0, 1], got {params.top_p}", "top_p")
    _between("min_p", params.min_p, 0.0, 1.0)
    if not isinstance(params.top_k, int) or params.top_k < 0:
        raise RequestRejected(
            f"top_k must be 0 (off) or a positive integer, got {params.top_k}", "top_k"
        )
    if params.repetition_penalty is not None:
        _between("repetition_penalty", params.repetition_penalty, 0.0, MAX_PENALTY)
        if params.repetition_penalty <= 0.0:
            raise RequestRejected("repetition_penalty must be greater than 0", "repetition_penalty")
    _between("presence_penalty", params.presence_penalty, -MAX_PENALTY, MAX_PENALTY)
    _between("frequency_penalty", params.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)
    for token, bias in (params.logit_bias or {}).items():
        if not isinstance(token, int) or not 0 <= token < vocab_size:
            raise RequestRejected(
                f"logit_bias token {token} is outside the vocabulary (0..{vocab_size - 1})",
                "logit_bias",
            )
        _between("logit_bias", bias, -MAX_PENALTY, MAX_PENALTY)
    if params.seed is not None and not 0 <= params.seed < 2**64:
        raise RequestRejected("seed must fit in 64 bits", "seed")
    if params.prompt_logprobs is not None and not (
        0 <= params.prompt_logprobs <= min(MAX_TOP_LOGPROBS, vocab_size)
    ):
        raise RequestRejected(
            f"prompt_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "prompt_logprobs"
        )
    if not 0 <= params.top_logprobs <= min(MAX_TOP_LOGPROBS, vocab_size):
        raise RequestRejected(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs"
        )


def check_request(request: GenerationRequest, limits: ModelLimits) -> None:
    """Refuse ``request`` when the model cannot run it (:class:`RequestRejected`)."""
    prompt = request.prompt_tokens
    n = len(prompt)
    if n == 0:
        raise RequestRejected("the prompt is empty", "messages")
    if min(prompt) < 0 or max(prompt) >= limits.vocab_size:
        raise RequestRejected("prompt token ids must be inside the vocabulary", "prompt")
    if any(not 0 <= t < limits.vocab_size for t in request.stop_token_ids):
        raise RequestRejected("stop token ids must be inside the vocabulary", "stop_token_ids")
    if not isinstance(request.max_tokens, int) or request.max_tokens < 1:
        raise RequestRejected("max_tokens must be at least 1", "max_tokens")
    check_sampling(request.sampling, limits.vocab_size)
    least = request.sampling.min_tokens
    if not isinstance(least, int) or not 0 <= least <= request.max_tokens:
        raise RequestRejected(
            f"min_tokens must be between 0 and max_tokens ({request.max_tokens})", "min_tokens"
        )
    total = n + request.max_tokens
    if limits.context is not None and total > limits.context:
        raise RequestRejected(
            f"prompt ({n} tokens) plus max_tokens ({request.max_tokens}) exceeds the "
            f"model's context length of {limits.context} tokens",
            "messages",
            "context_length_exceeded",
        )
    if limits.memory_context is not None and total > limits.memory_context:
        raise RequestRejected(
            f"prompt ({n} tokens) plus max_tokens ({request.max_tokens}) needs more memory "
            f"than this server has: at most {limits.memory_context} tokens of context fit",
            "messages",
            "context_length_exceeded",
        )


def check_stops(stops: Sequence[str], field: str = "stop") -> list[str]:
    """The non-empty stop strings, refused past :data:`MAX_STOPS` or :data:`MAX_STOP_CHARS`
    (the same limits on every route; ``field`` names the API's own field)."""
    if len(stops) > MAX_STOPS:
        raise RequestRejected(f"at most {MAX_STOPS} stop strings are allowed", field)
    for stop in stops:
        if len(stop) > MAX_STOP_CHARS:
            raise RequestRejected(
                f"a stop string may be at most {MAX_STOP_CHARS} characters", field
            )
    return [s for s in stops if s]
