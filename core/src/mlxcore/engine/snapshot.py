"""What other threads read of an engine: a snapshot the engine thread publishes.

The metrics thread (``/metrics``, ``/health``, the dashboard's history) and the other
models' engines (their admission counts what this model holds) must not walk the batch
loop while the engine thread changes it. So after each step the engine thread builds an
:class:`EngineSnapshot` and replaces the published one in a single assignment; readers
take whichever is current: figures at most one step old. While the engine thread
waits for work, :meth:`~mlxcore.engine.engine.Engine.stats` builds a fresh one under the
engine's lock instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from mlxcore.engine.admission import Admission, held_bytes

if TYPE_CHECKING:
    from mlxcore.engine.events import RequestHandle
    from mlxcore.engine.loop import BatchLoop
    from mlxcore.engine.step_sync import StepSync

log = logging.getLogger(__name__)


@attrs.frozen
class EngineSnapshot:
    """One engine's figures as of its latest step."""

    figures: Mapping[str, float]
    """Load, memory and strategy counters (``/metrics`` names without the prefix)."""
    reserved: int
    """Cache bytes the admitted requests may grow to, and the running job's."""

    @classmethod
    def of(
        cls,
        loop: BatchLoop,
        admission: Admission,
        sync: StepSync | None,
        admitted: Sequence[RequestHandle] = (),
    ) -> EngineSnapshot:
        """Read ``loop`` and ``admission`` (on the engine thread, or before it starts);
        ``admitted``: requests taken from the queue that the next step starts (their
        bytes are reserved already)."""
        reserved = admission.reserved(loop) + admission.cost(admitted)
        jobs, memory = admission.jobs, admission.memory
        figures: dict[str, float] = {
            "requests_running": len(loop.live),
            "prompt_tokens_processed": loop.counters["prompt_tokens_processed"],
            "prefill_shared_prefix_waits": loop.counters["prefill_shared_prefix_waits"],
            "decode_step_failures": loop.counters["decode_step_failures"],
            "decode_sequences_isolated": loop.quarantine.isolated,
            **jobs.stats(),
            **loop.cache.stats().gauges(),
            **memory.gauges(held_bytes(loop), reserved, admission.peak_reserved),
        }
        if sync is not None:
            figures.update({f"distributed_{k}": v for k, v in sync.stats().items()})
        try:
            figures.update({f"decoder_{k}": v for k, v in loop.decoder.stats().items()})
            figures.update({f"prefill_{k}": v for k, v in loop.prefill.stats().items()})
        except Exception:
            log.exception("a strategy's stats() failed")
        return cls(figures, reserved)
