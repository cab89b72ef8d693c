"""What an engine step was doing when the watchdog gave up on it: its culprits by name.

The batch loop notes the work of the step it is in (:class:`StepWork`: a prefill of some
requests, or a decode step of the rows in the batch); when a step makes no progress for
``--engine-watchdog`` seconds the watchdog, on its own thread, reads that note into a
:class:`StallReport` for its log line, ``/metrics`` (``mlxcore_engine_stall_seconds``,
labelled with the phase and the requests) and the engine's ``last_stall``. The engine
thread is stuck in MLX by then, so reading the loop's records from the watchdog's thread
is safe in practice; a record changing under it only shortens the list.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from mlxcore.engine.admitted import AdmittedRequest

NAMED = 8
"""Most requests a report names (a decode step of 128 rows names its first eight)."""


@attrs.frozen
class StepWork:
    """The work of the step in progress (engine thread writes, watchdog reads)."""

    phase: str = "idle"
    """``prefill``, ``decode`` or ``idle`` (between steps: admission, bookkeeping)."""
    requests: tuple[AdmittedRequest, ...] = ()
    """The requests being prefilled (a decode step reads the batch's rows instead)."""


IDLE = StepWork()
DECODING = StepWork("decode")
"""The notes of a step between its parts and of a decode step (made once, not per step)."""


@attrs.frozen
class StallReport:
    """A step the watchdog abandoned: what it was doing and for whom."""

    seconds: float
    phase: str
    requests: tuple[str, ...]
    """The requests' ids (at most :data:`NAMED`), with what made each heavy."""
    ids: tuple[str, ...]
    """The same requests' ids alone (the metric's label)."""
    more: int = 0
    """Requests in the step beyond those named."""
    at: float = attrs.field(factory=time.time)

    def summary(self) -> str:
        """One line for the log: ``prefill of cmpl-1 (7800 prompt tokens, ...)``."""
        named = ", ".join(self.requests) or "no request"
        extra = f" and {self.more} more" if self.more else ""
        return f"{self.phase} of {named}{extra}"


def describe(live: AdmittedRequest) -> str:
    """A request as a stall report names it: its id and the sizes a client controls."""
    req = live.request
    rid = req.request_id or str(live.handle.uid)
    parts = [f"{len(req.prompt_tokens)} prompt tokens", f"max_tokens {req.max_tokens}"]
    if req.sampling.prompt_logprobs is not None:
        parts.append(f"prompt_logprobs {req.sampling.prompt_logprobs}")
    if req.tenant is not None:
        parts.append(f"key {req.tenant}")
    return f"{rid} ({', '.join(parts)})"


def report(work: StepWork, decoding: Iterable[AdmittedRequest], seconds: float) -> StallReport:
    """The report of a stalled step doing ``work`` (``decoding``: the batch's rows, read
    when the step was a decode step)."""
    culprits = list(work.requests) if work.phase != "decode" else list(decoding)
    named = culprits[:NAMED]
    return StallReport(
        seconds=round(seconds, 1),
        phase=work.phase,
        requests=tuple(describe(live) for live in named),
        ids=tuple(live.request.request_id or str(live.handle.uid) for live in named),
        more=len(culprits) - len(named),
    )
