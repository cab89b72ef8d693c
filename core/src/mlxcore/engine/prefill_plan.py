"""Which prefill work the engine does in one step (decision 0009).

The engine thread alternates: some prefill work, then one decode step for the running
sequences. The policy here decides the prefill work:

* **A token budget per step.** While sequences are decoding, a step prefills at most
  ``--prefill-decode-chunk`` tokens (a long prompt is split into chunks of that size), so
  the running streams keep their cadence; with nothing decoding, a step takes the full
  ``--prefill-step-size``.
* **Short prompts first.** Prompts that fit in one step's budget and have not started
  are prefilled together (one batch, see :mod:`mlxcore.engine.batch_prefill`) ahead of a
  long prompt that is being prefilled: a title or summary request arriving behind a 20K-token
  agent turn does not wait for all of it. So that a stream of short requests cannot starve
  the long one, it gets its chunk after at most :data:`SHORT_TURNS` short batches in a row.
* **Shared prefixes once.** A request whose prompt shares at least
  :data:`SHARED_PREFIX_MIN_TOKENS` not-yet-computed tokens with a prompt being prefilled
  waits ("parks") until that prompt's prefill has passed the shared part; the leader stores
  a checkpoint exactly there, and the parked request then starts from it through the prefix
  cache. Sixteen sessions arriving together with one new 4K system prompt prefill it once.

These are pure functions over the engine's bookkeeping, so they can be tested alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs

SHORT_TURNS = 2
"""Short batches in a row before a long prefill in progress gets its next chunk."""

SHARED_PREFIX_MIN_TOKENS = 128
"""The fewest shared, uncomputed tokens worth waiting for another prompt's prefill."""

PADDING_SLACK = 256
"""Padded tokens a batch may always waste (short prompts cost little either way)."""


class Prefilling(Protocol):
    """What the policy reads of an admitted request waiting for, or in, its prefill."""

    @property
    def remaining(self) -> int:
        """Prompt tokens still to process."""

    @property
    def progress(self) -> int:
        """Prompt tokens the request's cache holds now."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def cheap_enough(lengths: Sequence[int], budget: int) -> bool:
    """Batch only while the padded batch (every row as long as the longest) is at most
    ``budget`` tokens, one step's work, and padding at most doubles the work, give or take
    :data:`PADDING_SLACK` tokens."""
    padded = len(lengths) * max(lengths)
    return padded <= budget and padded <= 2 * sum(lengths) + PADDING_SLACK


@attrs.frozen
class Plan:
    """The prefill work of one step.

    Attributes:
        group: the requests to prefill now; with ``short`` True they are prefilled whole
            (together when more than one), else ``group[0]`` advances by one chunk.
        short: True for short prompts prefilled whole ahead of (or without) a long one.
    """

    group: list[Prefilling]
    short: bool


def plan_step(
    queue: Iterable[Prefilling],
    is_short: Callable[[Prefilling], bool],
    budget: int,
    batch_cap: int,
    shorts_in_a_row: int,
    alone: Callable[[Prefilling], bool] | None = None,
) -> Plan | None:
    """Choose this step's prefill work (None: nothing to prefill).

    Args:
        queue: the requests in prefill, in arrival order.
        is_short: True for a request that has not started and may be prefilled whole
            within ``budget`` tokens (in a batch, when the strategy can batch it).
        budget: the step's prefill token budget.
        batch_cap: the most prompts prefilled together (``--prefill-batch-size``).
        shorts_in_a_row: short batches run since the long prompt last advanced.
        alone: True for a short prompt prefilled by itself when it comes first (an API
            key's first while others decode: its first token does not wait for a batch).
    """
    items = list(queue)
    if not items:
        return None
    shorts = [item for item in items if is_short(item)]
    longs = [item for item in items if not any(item is s for s in shorts)]
    if shorts and (not longs or shorts_in_a_row < SHORT_TURNS):
        group = [shorts[0]]
        for item in shorts[1:] if alone is None or not alone(shorts[0]) else []:
            if len(group) >= batch_cap:
                break
            if cheap_enough([*(g.remaining for g in group), item.remaining], budget):
                group.append(item)
        return Plan(group, short=True)
    return Plan([longs[0]], short=False)


@attrs.frozen
class SharedPrefix:
    """A request to wait for: ``leader`` will hold the first ``length`` tokens."""

    leader: object
    length: int


def find_shared_prefix(
    tokens: Sequence[int],
    candidates: Iterable[tuple[object, Sequence[int], int, list[int]]],
) -> SharedPrefix | None:
    """The prefill in progress worth waiting for, if any.

    Args:
        tokens: the new request's prompt (as the prefix cache keys it).
        candidates: ``(leader, leader_tokens, leader_progress, leader_checkpoints)`` for
            each request in prefill whose strategy stops at checkpoints.

    Returns the candidate sharing the most uncomputed tokens with ``tokens`` (at least
    :data:`SHARED_PREFIX_MIN_TOKENS` past what the leader has computed so far), and
    the length to wait for: an existing checkpoint of the leader when one lies within
    :data:`SHARED_PREFIX_MIN_TOKENS` below the shared length (so followers with slightly
    different suffixes share one snapshot), else the shared length itself.
    """
    best: SharedPrefix | None = None
    for leader, leader_tokens, progress, checkpoints in candidates:
        # the leader's checkpoints lie before its last prompt token (PrefillTask.checkpoints):
        # identical prompts (the n choices of one) share all but their last two tokens
        shared = min(common_prefix(tokens, leader_tokens), len(leader_tokens) - 2, len(tokens) - 1)
        near = [c for c in checkpoints if shared - SHARED_PREFIX_MIN_TOKENS < c <= shared]
        length = max(near) if near else shared
        if length - progress < SHARED_PREFIX_MIN_TOKENS:
            continue  # already computed (or about to be), or too little to share
        if best is None or length > best.length:
            best = SharedPrefix(leader, length)
    return best
