"""What the engine is asked to do: token ids plus per-request generation settings.

Front ends (OpenAI, Anthropic, the CLI) turn their own request shapes into a
:class:`GenerationRequest`; the engine never sees HTTP or JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from mlxcore.engine.cache_partition import MARKED_POSITIONS, partition_name, partition_tokens

GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy decoding, as in vLLM: sampling at ``1/T`` past
float32's range turns every logit to +-inf (a 1e-40 temperature sampled noise, and a
grammar-constrained request failed)."""


TOP_P_FLOOR = 1e-6
"""The smallest ``top_p`` used: a smaller one keeps the most likely token alone just the
same (below a million tokens none is less likely than that), while float32 rounds a tiny
one (5e-324) to 0, which kept nothing: samplers then drew outside the top token, and
outside a grammar's mask (a constrained request failed)."""


def _top_p(value: float) -> float:
    return TOP_P_FLOOR if 0.0 < value < TOP_P_FLOOR else value


@attrs.frozen
class SamplingParams:
    """Per-request sampling settings, honoured per sequence inside a batch.

    ``temperature`` below :data:`GREEDY_BELOW` (0 included) is greedy decoding. ``None``
    means "not set".
    """

    temperature: float = 0.0
    top_p: float = attrs.field(default=1.0, converter=_top_p)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    min_tokens: int = 0
    """End-of-sequence and stop tokens are not sampled before this many tokens (vLLM's)."""
    ignore_eos: bool = False
    """The model's end-of-sequence tokens do not end the generation (vLLM's): it runs to
    ``max_tokens`` or a stop token the request named."""
    prompt_logprobs: int | None = None
    """Compute each prompt token's logprob (with this many alternatives) during the
    prefill; ``None``: not asked. Such a prompt is prefilled whole (no prefix-cache read),
    so every position is computed."""

    @property
    def greedy(self) -> bool:
        """True for temperature 0, or below :data:`GREEDY_BELOW` (argmax decoding)."""
        return self.temperature < GREEDY_BELOW


@attrs.frozen
class GenerationRequest:
    """One generation: the prompt as token ids and how to continue it.

    Attributes:
        prompt_tokens: the full prompt, chat template already applied.
        max_tokens: the most tokens to generate.
        sampling: sampling settings.
        stop_token_ids: token ids that end generation (besides the model's EOS).
        options: per-request plugin options from the request body (e.g.
            ``{"speculative": False}``); plugins read their own keys.
        request_id: an id for logs and metrics.
        checkpoints: prompt positions where the cache state is worth keeping for
            reuse (the end of the conversation history, before the generation
            prompt): the next turn starts with exactly those tokens, which is what
            hybrid models, whose recurrent state cannot be rewound, need.
        boundaries: prompt positions where other requests sharing this prompt's start
            are likely to diverge from it (the start of each message's content in the
            rendered template). A cache strategy may snapshot there (see
            :meth:`~mlxcore.engine.strategies.CacheStrategy.snapshot_points`).
        media: the prompt's images or videos, already prepared by the loaded model's
            media handler (:class:`mlxcore.media.MediaHandler`); ``None`` for text-only
            requests. Opaque to the core: the prefill strategy that handles media reads it.
        cache_key: what the prefix cache sees instead of ``prompt_tokens`` (same length),
            when equal token ids do not mean equal state: a media prompt's placeholder
            tokens are the same for every image, so the media plugin replaces them with
            ids derived from the media's hash. ``None``: the prompt tokens themselves.
        trace_id: see the attribute.
        priority: where it queues (vLLM's convention: lower starts first, ties by
            arrival; ``None``: 0, or the API key's default, see
            :func:`mlxcore.server.keys.request_priority`).
        tenant: the name of the API key that sent it (``None`` on a server without
            keys): waiting requests of equal priority are admitted round-robin across
            tenants.
        cache_scope: whose prefix cache it reads and writes: its API key's cache group,
            or the key itself (``None``: the shared cache of a server without keys).
        cache_salt: the request's own ``cache_salt`` (vLLM's): it reuses only prefixes
            computed with the same salt in the same scope.
    """

    prompt_tokens: tuple[int, ...]
    max_tokens: int = 256
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    options: dict[str, Any] = attrs.field(factory=dict)
    request_id: str = ""
    checkpoints: tuple[int, ...] = ()
    boundaries: tuple[int, ...] = ()
    media: Any = None
    cache_key: tuple[int, ...] | None = None
    priority: int | None = None
    trace_id: str = ""
    """The HTTP request's id (``x-request-id``), for the engine's log lines about it."""
    tenant: str | None = None
    cache_scope: str | None = None
    cache_salt: str | None = None
    _cache_tokens: tuple[int, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        base = self.prompt_tokens if self.cache_key is None else self.cache_key
        partition = partition_name(self.cache_scope, self.cache_salt)
        object.__setattr__(self, "_cache_tokens", partition_tokens(base, partition))

    def keyed(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` (this request's prompt and what followed it) led by the prompt's
        first cache tokens, which carry its partition and adapter: the key under which a
        store of sequences other than the prefix cache (a draft model's prefix store)
        keeps them, so that each partition keeps its own."""
        head = self.cache_tokens[:MARKED_POSITIONS]
        return [*head, *tokens[len(head) :]]

    @property
    def cache_tokens(self) -> tuple[int, ...]:
        """The prompt as the prefix cache keys it: :attr:`cache_key` or the prompt, its
        first tokens replaced by its partition's markers when it has a cache scope or a
        salt (:mod:`mlxcore.engine.cache_partition`)."""
        return self._cache_tokens
