"""Background requests sitting out decode steps while interactive work runs.

The engine's admission decides which running requests pause (background work, see
``--background-priority``); :func:`pause_rows` takes them out of the decode batch through
the decoder's :meth:`~mlxcore.engine.strategies.Decoder.hold` (each with its own cache and
the token it had sampled but not reported) and adds them back when nothing picks them any
more, so they go on with exactly the tokens they would have produced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from mlxcore.engine.admitted import AdmittedRequest
from mlxcore.engine.events import RequestHandle
from mlxcore.engine.strategies import Decoder, DecodeSequence, SequenceCache, StepToken


def own_cache(seq: DecodeSequence) -> SequenceCache:
    """A sequence's own cache outside the decoder: every token but the next to feed."""
    return SequenceCache(seq.cache, len(seq.tokens) - 1)


class PausingLoop(Protocol):
    """What pausing needs of the batch loop (:class:`~mlxcore.engine.loop.BatchLoop`)."""

    decoder: Decoder
    live: dict[int, AdmittedRequest]
    paused: dict[int, DecodeSequence]

    def emit(
        self, live: AdmittedRequest, tokens: list[StepToken], step: tuple[int, int] | None = None
    ) -> bool:
        """Send tokens to the client; True when the request is now finished."""

    def retire(self, live: AdmittedRequest, own: SequenceCache | None) -> None:
        """Finish ``live``; offer its cache for prefix reuse."""


def pause_rows(loop: PausingLoop, pause: Callable[[RequestHandle], bool] | None) -> None:
    """Take the decoding requests of ``loop`` that ``pause`` picks out of its batch (the
    ones already out stay out); with ``pause`` ``None``, or a decoder that cannot hold
    sequences, put every paused one back instead."""
    if pause is None or not loop.decoder.supports_hold:
        for uid in list(loop.paused):
            seq = loop.paused.pop(uid)
            if uid in loop.live:
                loop.decoder.add(seq)
        return
    chosen = {
        uid
        for uid, live in loop.live.items()
        if live.seq is not None and uid not in loop.paused and pause(live.handle)
    }
    if not chosen:
        return
    for item in loop.decoder.hold(chosen):
        live = loop.live[item.seq.uid]
        live.seq = item.seq
        if item.unreported and loop.emit(live, item.unreported):
            loop.retire(live, own_cache(item.seq))
        else:
            loop.paused[item.seq.uid] = item.seq
