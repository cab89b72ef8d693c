"""Why a prefix-cache lookup reused what it did, and why the rest of the prompt missed.

Every lookup is classified (:func:`explain_lookup`), counted by class in ``/metrics``
(``mlxcore_prefix_cache_lookups_<reason>``), logged at debug level, and returned to a
client that asks for it with ``"explain_cache": true`` (as ``usage.mlxcore.cache``).

The classes (:data:`REASONS`):

``full``
    Everything but the last prompt token came from the cache.
``new_suffix``
    A stored entry was used whole; the prompt goes on past it (the next turn of a
    conversation). The rest of the prompt is new.
``diverged``
    The closest stored entry holds a different token at ``diverged_at``; the cache
    was cut back to there.
``snapshot``
    The prompt shares ``diverged_at`` tokens with stored entries, and the model holds
    recurrent state (hybrid models) that cannot be rewound: it resumed from the deepest
    snapshot before that point, at token ``cached_tokens``.
``recurrent_boundary``
    As ``snapshot``, but no snapshot lies before the point where the prompt leaves the
    stored entries: nothing was reused.
``evicted``
    An entry that would have covered more (``diverged_at`` tokens) was stored but
    evicted to make room.
``no_entry``
    No stored entry shares a token with the prompt.
``disabled``
    The prefix cache is off (``--prefix-cache-size 0``).
``shared_prefix``
    The request waits for another request's prefill of the same prefix and reuses it.
"""

from __future__ import annotations

from typing import Any

import attrs

EXPLAIN_OPTION = "explain_cache"
"""Request option: ``"explain_cache": true`` adds the explanation to the response's usage."""

REASONS = (
    "full",
    "new_suffix",
    "diverged",
    "snapshot",
    "recurrent_boundary",
    "evicted",
    "no_entry",
    "disabled",
    "shared_prefix",
)


@attrs.frozen
class CacheExplanation:
    """The outcome of one prefix-cache lookup.

    Attributes:
        reason: one of :data:`REASONS`.
        prompt_tokens: the prompt's length.
        cached_tokens: how many leading prompt tokens the cache supplied.
        entry_tokens: the length of the stored entry the explanation is about (the one
            used, or the one that would have helped), 0 when there is none.
        diverged_at: how many leading tokens the prompt shares with that entry.
        source: where the reused state came from: ``memory``, ``disk`` (a plugin's
            tier), ``prefill`` (another request's prefill), or None.
    """

    reason: str
    prompt_tokens: int
    cached_tokens: int = 0
    entry_tokens: int = 0
    diverged_at: int = 0
    source: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape returned to clients."""
        return attrs.asdict(self)

    def summary(self) -> str:
        """One line for the debug log."""
        text = f"{self.cached_tokens}/{self.prompt_tokens} cached"
        if self.source:
            text += f" from {self.source}"
        text += f"; rest: {self.reason}"
        if self.reason == "snapshot":
            text += f" (resumed at token {self.cached_tokens} of a shared {self.diverged_at})"
        elif self.entry_tokens:
            text += f" (entry of {self.entry_tokens} tokens, shared {self.diverged_at})"
        return text


def explain_lookup(
    prompt_tokens: int,
    cached_tokens: int,
    *,
    entry_tokens: int,
    shared: int,
    trimmable: bool,
    source: str | None,
    evicted_tokens: int = 0,
    evicted_shared: int = 0,
) -> CacheExplanation:
    """Classify a lookup.

    Args:
        prompt_tokens: the prompt's length.
        cached_tokens: what the lookup reused.
        entry_tokens: the length of the closest stored entry (0: nothing stored).
        shared: the longest prefix the prompt shares with any stored entry.
        trimmable: whether stored state can be cut back to any prefix.
        source: where the reused state came from (None when nothing was reused).
        evicted_tokens: the length of the closest entry evicted earlier (0: none).
        evicted_shared: how much of the prompt that evicted entry shared.
    """
    common = {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens}
    src = source if cached_tokens else None
    if cached_tokens and cached_tokens >= prompt_tokens - 1:
        return CacheExplanation("full", entry_tokens=entry_tokens, diverged_at=shared,
                                source=src, **common)  # fmt: skip
    if evicted_shared > max(cached_tokens, shared):
        return CacheExplanation("evicted", entry_tokens=evicted_tokens,
                                diverged_at=evicted_shared, source=src, **common)  # fmt: skip
    if not entry_tokens or not shared:
        return CacheExplanation("no_entry", source=src, **common)
    if shared > cached_tokens and not trimmable:
        reason = "snapshot" if cached_tokens else "recurrent_boundary"
    elif cached_tokens >= entry_tokens:
        reason = "new_suffix"
    else:
        reason = "diverged"
    return CacheExplanation(reason, entry_tokens=entry_tokens, diverged_at=shared,
                            source=src, **common)  # fmt: skip
