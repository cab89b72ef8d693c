"""What a batch loop is built from: :class:`EngineParts` gives the
:class:`~mlxcore.engine.loop.BatchLoop` its strategies (called again for every fresh
loop) and the plugins' per-request logits processors. What keeps the steps in step with
other processes is :class:`mlxcore.engine.step_sync.StepSync`.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from mlxcore.engine.request import GenerationRequest
from mlxcore.engine.strategies import CacheStrategy, Decoder, LogitsProcessor, PrefillStrategy


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
