"""What a batch loop is built from and kept in step with.

:class:`EngineParts` gives the :class:`~mlxcore.engine.loop.BatchLoop` its strategies
(called again for every fresh loop) and the plugins' per-request logits processors;
:class:`StepSync` is what keeps an engine's steps in step with other processes (a
distributed engine's rank 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import attrs

from mlxcore.engine.events import RequestHandle
from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import CacheStrategy, Decoder, LogitsProcessor, PrefillStrategy

if TYPE_CHECKING:
    from mlxcore.engine.loop import BatchLoop


@attrs.frozen
class EngineParts:
    """How an engine gets its strategies (called again for every fresh loop) and the
    per-request logits processors plugins add.

    Attributes:
        cache: builds the cache strategy.
        prefill: builds the prefill strategy.
        decoder: builds the decoder.
        processors_for: the plugins' logits processors for one request.
    """

    cache: Callable[[], CacheStrategy]
    prefill: Callable[[], PrefillStrategy]
    decoder: Callable[[], Decoder]
    processors_for: Callable[[GenerationRequest], list[LogitsProcessor]] = lambda _r: []


class StepSync(Protocol):
    """What keeps an engine's steps in step with other processes (a distributed
    engine's rank 0: :class:`mlxcore.distributed.lockstep.Lockstep`)."""

    def lead(self, loop: BatchLoop, admitted: list[RequestHandle]) -> list[RequestHandle]:
        """Before a step: announce it; returns the handles the loop admits."""
        ...

    def pause(self) -> float:
        """The engine is idle: pause the others; returns how long to wait (seconds)."""
        ...

    def close(self) -> None:
        """The engine stops: tell the others."""
        ...

    def fault_note(self, exc: BaseException | None) -> str:
        """The end of an engine fault's reason (``exc``: what escaped a step; ``None``:
        a step that made no progress)."""
        ...

    def stats(self) -> dict[str, float]:
        """Gauges for ``/metrics``."""
        ...

    @property
    def deadline(self) -> float:
        """Seconds after which a step that has not ended is a fault (the watchdog)."""
        ...
