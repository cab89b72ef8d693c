"""Request priorities: the engine admits by priority (lower first, vLLM's convention), then
by arrival, with waiting time aging a request up so none starves; an API key's level is
its requests' default and the best they may ask for."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from pathlib import Path

from mlxcore.engine.admission import admission_order
from mlxcore.engine.events import Event, FinishEvent, RequestHandle, TokenEvent
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.server.keys import ApiKey, request_priority
from mlxcore.testing.runtime import make_runtime


def handle(uid: int, priority: int | None, queued_at: float) -> RequestHandle:
    h = RequestHandle(uid, GenerationRequest((1, 2, 3), 4, priority=priority), lambda e: None)
    h.queued_at = queued_at
    return h


def test_order_is_priority_then_arrival() -> None:
    waiting = [handle(1, 1, 0.0), handle(2, None, 1.0), handle(3, -1, 2.0), handle(4, 1, 3.0)]
    order = admission_order(waiting, now=4.0, aging=0.0)
    assert [h.uid for h in order] == [3, 2, 1, 4]
    # the same priority everywhere: arrival order, untouched
    same = [handle(i, 2, float(i)) for i in range(5)]
    assert [h.uid for h in admission_order(same, now=9.0, aging=0.0)] == [0, 1, 2, 3, 4]


def test_waiting_ages_a_request_up() -> None:
    old_low = handle(1, 1, 0.0)
    new_high = handle(2, -1, 9.0)
    # strict: the high one goes first however long the low one waited
    assert admission_order([old_low, new_high], now=10.0, aging=0.0)[0] is new_high
    # one level per 2 s: after 10 s the low one (1 - 5 = -4) beats the fresh high (-1.5)
    assert admission_order([old_low, new_high], now=10.0, aging=2.0)[0] is old_low
    # not yet after 2 s (1 - 1 = 0 against -1)
    assert admission_order([old_low, handle(3, -1, 2.0)], now=2.0, aging=2.0)[0].uid == 3


def test_a_keys_level_is_the_default_and_the_best_it_may_ask_for() -> None:
    low = ApiKey("batch", b"k", priority="low")
    high = ApiKey("ops", b"k2", priority="high")
    free = ApiKey("plain", b"k3")
    assert request_priority(None, None) is None
    assert request_priority(-5, None) == -5
    assert request_priority(None, low) == 1
    assert request_priority(-5, low) == 1  # cannot jump the queue
    assert request_priority(7, low) == 7  # may ask to wait longer
    assert request_priority(None, high) == -1
    assert request_priority(-3, free) == -3 and request_priority(None, free) is None


def greedy(max_tokens: int, priority: int | None = None) -> GenerationRequest:
    return GenerationRequest(
        (1, 2, 3, 4), max_tokens, SamplingParams(temperature=0.0), priority=priority
    )


def test_engine_admits_a_high_priority_request_before_earlier_low_ones(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama, max_num_seqs=1, priority_aging=0.0)
    admitted: list[str] = []
    lock = threading.Lock()

    def note(name: str) -> None:
        with lock:
            admitted.append(name)

    try:
        first: queue.SimpleQueue[Event] = queue.SimpleQueue()
        rt.engine.submit(greedy(60), first.put)
        assert isinstance(first.get(timeout=30), TokenEvent)  # it runs; the rest wait
        done: queue.SimpleQueue[Event] = queue.SimpleQueue()
        for i in range(3):
            rt.engine.submit(greedy(4, 1), done.put, lambda i=i: note(f"low{i}"))
        rt.engine.submit(greedy(4), done.put, lambda: note("default"))
        rt.engine.submit(greedy(4, -1), done.put, lambda: note("high"))
        finished = 0
        deadline = time.monotonic() + 60
        while finished < 5 and time.monotonic() < deadline:
            if isinstance(done.get(timeout=60), FinishEvent):
                finished += 1
        assert admitted == ["high", "default", "low0", "low1", "low2"]
    finally:
        rt.engine.shutdown(timeout=5)


def test_a_low_priority_request_still_starts_under_sustained_high_load(tiny_llama: Path) -> None:
    """With aging, a low request waiting behind a stream of high ones gets its turn."""
    rt = make_runtime(tiny_llama, max_num_seqs=1, priority_aging=0.2)
    order: list[str] = []
    try:
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        rt.engine.submit(greedy(20, -1), events.put, lambda: order.append("high"))
        rt.engine.submit(greedy(4, 1), events.put, lambda: order.append("low"))
        deadline = time.monotonic() + 60
        while "low" not in order and time.monotonic() < deadline:
            # keep two high requests waiting at all times
            waiting = rt.engine.stats()["requests_waiting"]
            for _ in range(max(0, 3 - int(waiting))):
                rt.engine.submit(greedy(20, -1), events.put, lambda: order.append("high"))
            time.sleep(0.05)
        assert "low" in order
        assert order.index("low") > 0  # it did wait behind high ones first
    finally:
        rt.engine.shutdown(timeout=5)


BACKGROUND = 1_000_000  # the default --background-priority


def collect(events: queue.SimpleQueue[Event], log: list[tuple[float, str, list[int]]], tag: str):
    def put(event: Event) -> None:
        tokens = [t.token for t in event.tokens] if isinstance(event, TokenEvent) else []
        kind = "finish" if isinstance(event, FinishEvent) else "token"
        log.append((time.monotonic(), f"{tag}:{kind}", tokens))
        events.put(event)

    return put


def wait_finish(events: queue.SimpleQueue[Event]) -> None:
    while not isinstance(events.get(timeout=120), FinishEvent):
        pass


def test_background_work_pauses_while_an_interactive_request_runs(tiny_llama: Path) -> None:
    """A running background request sits out every step while an interactive one runs
    (and for the grace after it), a waiting one does not start, and both then finish with
    exactly the tokens they get alone."""
    alone = make_runtime(tiny_llama)
    try:
        expected: list[list[int]] = []
        for request in (greedy(120, BACKGROUND), greedy(60), greedy(8, BACKGROUND)):
            seen: list[tuple[float, str, list[int]]] = []
            done: queue.SimpleQueue[Event] = queue.SimpleQueue()
            alone.engine.submit(request, collect(done, seen, "x"))
            wait_finish(done)
            expected.append([t for _, _, tokens in seen for t in tokens])
    finally:
        alone.engine.shutdown(timeout=5)

    rt = make_runtime(tiny_llama, background_grace=0.5)
    log: list[tuple[float, str, list[int]]] = []
    try:
        bg: queue.SimpleQueue[Event] = queue.SimpleQueue()
        fg: queue.SimpleQueue[Event] = queue.SimpleQueue()
        late: queue.SimpleQueue[Event] = queue.SimpleQueue()
        rt.engine.submit(greedy(120, BACKGROUND), collect(bg, log, "bg"))
        while not any(tag == "bg:token" for _, tag, _ in log):
            time.sleep(0.005)
        rt.engine.submit(greedy(60), collect(fg, log, "fg"))
        rt.engine.submit(greedy(8, BACKGROUND), collect(late, log, "late"))
        wait_finish(fg)
        wait_finish(bg)
        wait_finish(late)
    finally:
        rt.engine.shutdown(timeout=5)
    first_fg = next(t for t, tag, _ in log if tag == "fg:token")
    fg_done = next(t for t, tag, _ in log if tag == "fg:finish")
    assert any(tag == "bg:token" and t > fg_done for t, tag, _ in log)  # it was still going
    during = [tag for t, tag, _ in log if first_fg <= t <= fg_done and not tag.startswith("fg")]
    assert during == []  # nothing background ran while the interactive request did
    resumed = min(t for t, tag, _ in log if tag != "fg:finish" and t > fg_done)
    assert resumed - fg_done >= 0.4  # the grace after it
    by_tag = {
        tag: [tok for _, name, tokens in log if name == f"{tag}:token" for tok in tokens]
        for tag in ("bg", "fg", "late")
    }
    assert [by_tag["bg"], by_tag["fg"], by_tag["late"]] == expected


def test_each_prefill_chunk_is_timed_with_its_tokens(tiny_llama: Path) -> None:
    """The engine notes every chunk of a long prompt's prefill and tallies its decode
    steps (what tracing shows)."""
    rt = make_runtime(tiny_llama, prefill_step_size=16)
    try:
        done: queue.SimpleQueue[Event] = queue.SimpleQueue()
        prompt = tuple(range(10, 110))
        rt.engine.submit(GenerationRequest(prompt, 2, SamplingParams(temperature=0.0)), done.put)
        event = done.get(timeout=60)
        while not isinstance(event, FinishEvent):
            event = done.get(timeout=60)
    finally:
        rt.engine.shutdown(timeout=5)
    *steps, decode = event.usage.steps
    assert len(steps) >= 100 // 16 and {s.name for s in steps} == {"prefill_chunk"}
    assert decode.name == "decode" and decode.figures["tokens"] == 1  # the first: prefill's
    assert steps[-1].end_ns <= decode.start_ns
    assert sum(s.figures["tokens"] for s in steps) == 100 - event.usage.cached_tokens
    for a, b in itertools.pairwise(steps):
        assert a.start_ns <= a.end_ns <= b.start_ns


def test_a_shutdown_drains_paused_background_work(tiny_llama: Path) -> None:
    """Shutting down while background work is paused lets it run to its end."""
    rt = make_runtime(tiny_llama, background_grace=30.0)
    bg: queue.SimpleQueue[Event] = queue.SimpleQueue()
    fg: queue.SimpleQueue[Event] = queue.SimpleQueue()
    rt.engine.submit(greedy(80, BACKGROUND), bg.put)
    assert isinstance(bg.get(timeout=30), TokenEvent)
    rt.engine.submit(greedy(4), fg.put)
    wait_finish(fg)  # the background request is paused now, for 30 s
    started = time.monotonic()
    rt.engine.shutdown(timeout=20)
    assert time.monotonic() - started < 15  # it did not wait out the grace
    event = bg.get(timeout=1)
    while not isinstance(event, FinishEvent):
        event = bg.get(timeout=1)
    assert event.reason in ("length", "stop") and event.usage.completion_tokens > 1


def test_a_burst_behind_held_background_work_is_still_gathered(tiny_llama: Path) -> None:
    """Interactive requests arriving a few milliseconds apart start together
    (``--burst-gather``) even when held background work waits in front of them: its old
    arrival time must not end the gathering at once (found by
    scripts/batch_beside_streams.py: inter-token p99 +25% beside a batch)."""
    rt = make_runtime(tiny_llama, burst_gather=0.1, background_grace=30.0)
    try:
        first: queue.SimpleQueue[Event] = queue.SimpleQueue()
        rt.engine.submit(greedy(1), first.put)  # an interactive request: background waits
        wait_finish(first)
        rt.engine.submit(greedy(4, BACKGROUND), lambda e: None)  # held in the queue
        time.sleep(0.7)  # longer than the gathering's cap (5 x 0.1 s) from its arrival
        admitted: list[float] = []
        burst = [queue.SimpleQueue[Event]() for _ in range(4)]
        for events in burst:
            rt.engine.submit(greedy(2), events.put, lambda: admitted.append(time.monotonic()))
            time.sleep(0.02)
        for events in burst:
            wait_finish(events)
    finally:
        rt.engine.shutdown(timeout=5)
    assert len(admitted) == 4
    assert max(admitted) - min(admitted) < 0.03  # one admission, not one per arrival
