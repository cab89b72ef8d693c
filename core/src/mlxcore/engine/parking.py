"""Requests waiting for another prompt's prefill of their shared prefix (decision 0009).

:func:`park` lets a newly admitted request wait ("park") behind a prefill in progress that
computes much of its prompt (:func:`~mlxcore.engine.prefill_plan.find_shared_prefix`); the
leader stores a checkpoint where they part, and :func:`unpark` starts the follower from it
through the prefix cache once the leader has passed it, or left however it ended.
"""

from __future__ import annotations

import collections
import logging
from typing import Protocol

from mlxcore.engine.admitted import AdmittedRequest, Parked
from mlxcore.engine.cache_explain import CacheExplanation
from mlxcore.engine.prefill_plan import find_shared_prefix
from mlxcore.engine.strategies import PrefillStrategy

log = logging.getLogger("mlxcore.engine.loop")


class ParkingLoop(Protocol):
    """What parking needs of the batch loop (:class:`~mlxcore.engine.loop.BatchLoop`)."""

    prefill: PrefillStrategy
    prefilling: collections.deque[AdmittedRequest]
    parked: list[Parked]
    counters: collections.Counter[str]

    def explain(self, live: AdmittedRequest, explanation: CacheExplanation | None) -> None:
        """Log (and hand to the request) a prefix-cache explanation."""

    def finish(
        self, live: AdmittedRequest, reason: str, error: str | None = None, code: str | None = None
    ) -> None:
        """End ``live`` with ``reason``."""

    def start_prefill(self, live: AdmittedRequest) -> None:
        """Queue ``live``'s prefill."""


def park(loop: ParkingLoop, live: AdmittedRequest) -> bool:
    """Let ``live`` wait for a prefill in progress that computes much of its prompt;
    False when there is none worth waiting for."""
    if live.request.media is not None or not loop.prefill.stops_at_checkpoints:
        return False
    if live.request.sampling.prompt_logprobs is not None:
        return False
    candidates = [
        (other, other.request.cache_tokens, other.progress, other.task.extra_checkpoints)
        for other in loop.prefilling
        if other.task is not None
        and other.request.media is None
        and other.handle.cancel_reason is None
    ]
    try:
        shared = find_shared_prefix(live.request.cache_tokens, candidates)
    except Exception:
        log.exception("looking for a shared prefix failed")
        return False
    if shared is None:
        return False
    leader = next(c[0] for c in candidates if c[0] is shared.leader)
    assert leader.task is not None
    if shared.length not in leader.task.extra_checkpoints:
        leader.task.extra_checkpoints.append(shared.length)
    live.handle.cached_tokens = shared.length  # what it will reuse from the leader
    tokens = len(live.request.cache_tokens)
    loop.explain(
        live,
        CacheExplanation(
            "shared_prefix", tokens, shared.length, shared.length, shared.length, "prefill"
        ),
    )
    loop.parked.append(Parked(live, leader, shared.length))
    loop.counters["prefill_shared_prefix_waits"] += 1
    return True


def unpark(loop: ParkingLoop) -> None:
    """Start the waiting requests whose leader passed the shared prefix or left."""
    waiting: list[Parked] = []
    for entry in loop.parked:
        follower, leader = entry.follower, entry.leader
        if follower.handle.cancel_reason is not None:
            loop.finish(follower, follower.handle.cancel_reason)
        elif leader in loop.prefilling and leader.progress < entry.length:
            waiting.append(entry)
        else:
            loop.start_prefill(follower)
    loop.parked = waiting
