"""How long the engine's steps take, against the step-time target: the figures behind
``/metrics`` (``mlxcore_engine_step_seconds_max``, ``mlxcore_engine_steps_over_target``)
and a warning that names the work of a step far over the target.

A step is one :meth:`~mlxcore.engine.loop.BatchLoop.iterate`: the prefill work the
budget allowed (:mod:`mlxcore.engine.prefill_pacer`) and one decode step. The budget
sizes a step's prefill from measured costs, so a step over the target by more than
:data:`OVER_FACTOR` means a cost the budget did not foresee (a first chunk before any
measurement, a processor, a slow machine): the log line says which requests it held, so
the next one has a culprit before it ever reaches the watchdog.
"""

from __future__ import annotations

import logging
import time

import attrs

from mlxcore.engine.stall import StepWork, describe

log = logging.getLogger(__name__)

OVER_FACTOR = 2.0
"""A step longer than this many times the target is counted and logged."""

WARN_INTERVAL = 5.0
"""Seconds between two warnings about slow steps (the count keeps every one)."""


@attrs.define
class StepTimes:
    """Durations of the engine's steps (engine thread writes, any thread reads numbers).

    Args:
        target: the step-time target in seconds (what the budget sizes a step to).
    """

    target: float
    longest: float = 0.0
    """The longest step so far (seconds)."""
    over: int = 0
    """Steps longer than :data:`OVER_FACTOR` times the target."""
    steps: int = 0
    _warned: float = -WARN_INTERVAL

    def observe(self, seconds: float, work: StepWork, rows: int) -> None:
        """Record one step of ``seconds`` whose prefill part was ``work`` beside ``rows``
        decoding rows (every step: plain numbers, nothing built)."""
        self.steps += 1
        self.longest = max(self.longest, seconds)
        if seconds <= OVER_FACTOR * self.target:
            return
        self.over += 1
        now = time.monotonic()
        if now - self._warned < WARN_INTERVAL:
            return
        self._warned = now
        named = [describe(live) for live in work.requests[:4]]
        log.warning(
            "an engine step took %.2f s (target %.2f s): %s%s beside %d decoding rows",
            seconds,
            self.target,
            work.phase,
            f" of {', '.join(named)}" if named else "",
            rows,
        )

    def figures(self) -> dict[str, float]:
        """The step figures for ``/health`` and ``/metrics``."""
        return {
            "engine_step_seconds_max": round(self.longest, 4),
            "engine_steps_over_target": float(self.over),
            "step_time_target_seconds": self.target,
        }
