"""Finding the sequence that makes decode steps fail, without failing the others.

When a decode step raises and the decoder can give its sequences back intact
(:meth:`~mlxcore.engine.strategies.Decoder.salvage`), the engine retries with half of
the suspects and holds the other half here; after each step that goes through it lets the
next held group back in, and those become the suspects. Sequences that went through a
step are cleared. A step that fails again splits its suspects again, so the sequence at
fault ends up alone and fails alone, after about log2(batch size) + 1 failed steps;
every other sequence goes on with its own cache, exactly as it would have.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Protocol

from mlxcore.engine.admitted import AdmittedRequest
from mlxcore.engine.parts import EngineParts
from mlxcore.engine.strategies import Decoder, DecodeSequence, SequenceCache, StepToken

log = logging.getLogger("mlxcore.engine.loop")


class Quarantine:
    """Groups of sequences held out of the decode batch, in the order they go back."""

    def __init__(self) -> None:
        self.groups: list[list[DecodeSequence]] = []
        self.suspects: set[int] | None = None
        """Uids that may have made the last step fail (``None``: every sequence)."""
        self.isolated = 0
        """Sequences found at fault and failed alone."""

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __len__(self) -> int:
        return sum(len(group) for group in self.groups)

    def suspected(self, rows: list[DecodeSequence]) -> list[DecodeSequence]:
        """Those of ``rows`` that may have made the step fail."""
        if self.suspects is None:
            return list(rows)
        return [seq for seq in rows if seq.uid in self.suspects]

    def split(self, suspects: list[DecodeSequence]) -> list[DecodeSequence]:
        """The suspects of a failed step (two or more): hold half back (they go back in
        first, once a step goes through); return the half to retry now (still suspects)."""
        half = max(1, len(suspects) // 2)
        self.groups.insert(0, suspects[half:])
        self.suspects = {seq.uid for seq in suspects[:half]}
        return suspects[:half]

    def release(self, alive: Callable[[int], bool]) -> list[DecodeSequence]:
        """The next held group, without the sequences that ended meanwhile; they are the
        suspects now (what ran before them went through a step). Nothing held: nobody is
        suspected any more."""
        while self.groups:
            group = [seq for seq in self.groups.pop(0) if alive(seq.uid)]
            if group:
                self.suspects = {seq.uid for seq in group}
                return group
        self.suspects = None
        return []

    def clear(self) -> None:
        """Forget every held sequence (the engine failed them)."""
        self.groups.clear()
        self.suspects = None


class RecoveringLoop(Protocol):
    """What recovering a failed step needs of the batch loop
    (:class:`~mlxcore.engine.loop.BatchLoop`)."""

    parts: EngineParts
    decoder: Decoder
    live: dict[int, AdmittedRequest]
    quarantine: Quarantine
    paused: dict[int, DecodeSequence]
    counters: collections.Counter[str]

    def emit(
        self, live: AdmittedRequest, tokens: list[StepToken], step: tuple[int, int] | None = None
    ) -> bool:
        """Send tokens; True when the request is now finished."""

    def retire(self, live: AdmittedRequest, own: SequenceCache | None) -> None:
        """Finish ``live``; offer its cache for prefix reuse."""

    def fail(self, live: AdmittedRequest, exc: BaseException) -> None:
        """End one request with an error."""


def recover_failed_step(loop: RecoveringLoop, exc: Exception) -> None:
    """A decode step of ``loop`` raised: retry without half of its sequences when the
    decoder gives them back intact (this module's docstring), else fail the batch."""
    decoding = [live for live in loop.live.values() if live.seq is not None]
    try:
        rows = loop.decoder.salvage()
    except Exception:
        log.exception("decoder %s: salvaging the batch failed", loop.decoder.name)
        rows = None
    loop.decoder = loop.parts.decoder()  # the failed one is not used again
    loop.counters["decode_step_failures"] += 1
    held = {seq.uid for group in loop.quarantine.groups for seq in group} | set(loop.paused)
    if rows is None:
        log.error("decode step failed; failing the sequences in the batch", exc_info=exc)
        for live in decoding:
            if live.handle.uid not in held:
                loop.fail(live, exc)
        return
    survivors: list[DecodeSequence] = []
    for item in rows:
        owner = loop.live.get(item.seq.uid)
        if owner is None:
            continue
        owner.seq = item.seq
        if item.unreported and loop.emit(owner, item.unreported):
            loop.retire(owner, item.seq.own_cache())
        else:
            survivors.append(item.seq)
    # nobody suspected failed anyway (the cause is not one sequence): suspect all again
    suspects = loop.quarantine.suspected(survivors) or survivors
    for seq in survivors:
        if seq not in suspects:
            loop.decoder.add(seq)  # went through a step since the last failure
    if len(suspects) == 1:
        loop.quarantine.isolated += 1
        loop.quarantine.suspects = set()
        loop.fail(loop.live[suspects[0].uid], exc)  # alone, it still failed: the cause
        return
    log.warning(
        "decode step failed (%s: %s); retrying with %d of its %d suspects",
        type(exc).__name__, exc, max(1, len(suspects) // 2), len(suspects),
    )  # fmt: skip
    for seq in loop.quarantine.split(suspects) if suspects else []:
        loop.decoder.add(seq)
