"""What keeps an engine's steps in step with other processes (a distributed engine's
rank 0: :class:`mlxcore.distributed.lockstep.Lockstep`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from mlxcore.engine.events import RequestHandle

if TYPE_CHECKING:
    from mlxcore.engine.loop import BatchLoop


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
