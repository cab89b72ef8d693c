"""Engine events reach an event loop in batches: one wake-up per engine step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from mlxcore.engine.handoff import LoopHandoff, handoff_for, step_batch


class CountingLoop:
    """A real event loop in its own thread; counts the wake-ups asked of it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.wakes = 0
        real = self.loop.call_soon_threadsafe

        def counted(callback: Any, *args: Any) -> Any:
            self.wakes += 1
            return real(callback, *args)

        self.loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def drain(self) -> None:
        """Wait until everything scheduled so far has run."""
        done = threading.Event()
        self.loop.call_soon_threadsafe(done.set)
        assert done.wait(5)
        self.wakes -= 1

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def counting() -> Any:
    loop = CountingLoop()
    yield loop
    if not loop.loop.is_closed():
        loop.close()


def test_a_step_wakes_each_loop_once_for_all_its_events(counting: CountingLoop) -> None:
    handoff = LoopHandoff(counting.loop)
    got: list[tuple[int, int]] = []
    with step_batch():
        for request in range(64):
            for token in range(2):
                handoff.post(lambda r, t: got.append((r, t)), request, token)
        assert counting.wakes == 0  # held until the step's work is done
    counting.drain()
    assert counting.wakes == 1
    assert got == [(r, t) for r in range(64) for t in range(2)]  # in order


def test_outside_a_step_events_are_handed_over_at_once(counting: CountingLoop) -> None:
    handoff = LoopHandoff(counting.loop)
    got: list[int] = []
    handoff.post(got.append, 1)
    counting.drain()
    handoff.post(got.append, 2)
    counting.drain()
    assert got == [1, 2] and counting.wakes == 2


def test_nested_steps_wake_at_the_outermost_end(counting: CountingLoop) -> None:
    handoff = LoopHandoff(counting.loop)
    got: list[int] = []
    with step_batch():
        with step_batch():
            handoff.post(got.append, 1)
        handoff.post(got.append, 2)
        assert counting.wakes == 0
    counting.drain()
    assert got == [1, 2] and counting.wakes == 1


def test_a_failing_callback_does_not_lose_the_others(counting: CountingLoop) -> None:
    handoff = LoopHandoff(counting.loop)
    got: list[int] = []

    def broken(_: int) -> None:
        raise ValueError("consumer bug")

    with step_batch():
        handoff.post(got.append, 1)
        handoff.post(broken, 2)
        handoff.post(got.append, 3)
    counting.drain()
    assert got == [1, 3]


def test_a_closed_loop_refuses_like_call_soon_threadsafe(counting: CountingLoop) -> None:
    """The engine's ``send`` cancels a request whose sink raises: a closed loop must raise
    at the post, not lose the event silently."""
    handoff = LoopHandoff(counting.loop)
    counting.close()
    with pytest.raises(RuntimeError):
        handoff.post(print, "never")


def test_one_handoff_per_loop(counting: CountingLoop) -> None:
    assert handoff_for(counting.loop) is handoff_for(counting.loop)
    other = asyncio.new_event_loop()
    try:
        assert handoff_for(other) is not handoff_for(counting.loop)
    finally:
        other.close()


def test_a_step_that_never_ends_holds_back_only_its_own_events(counting: CountingLoop) -> None:
    """A hung step keeps its wake-up; the watchdog thread's events (the failures it sends
    the hung step's requests) still reach the loop, with what the step had queued."""
    handoff = LoopHandoff(counting.loop)
    got: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def hung_step() -> None:
        with step_batch():
            handoff.post(got.append, "token")
            inside.set()
            release.wait(5)

    engine = threading.Thread(target=hung_step)
    engine.start()
    assert inside.wait(5)
    handoff.post(got.append, "failure")  # this thread holds nothing
    counting.drain()
    assert got == ["token", "failure"]
    release.set()
    engine.join(5)
