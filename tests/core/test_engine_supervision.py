"""The supervised engine, in process: faults, restarts, queue deadlines, shutdown, memory.

Faults come from the fault-injection plugin (:mod:`mlxcore.testing.faults`) through the
real loader and the real engine on a tiny real model.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import mlx.core as mx
import pytest

from mlxcore.engine import threads
from mlxcore.engine.engine import EngineUnavailable
from mlxcore.engine.events import (
    OVERLOADED,
    UNAVAILABLE,
    Event,
    FinishEvent,
    RequestHandle,
    TokenEvent,
    Usage,
)
from mlxcore.engine.request import GenerationRequest, SamplingParams
from mlxcore.engine.sampling import repair_random_state
from mlxcore.engine.strategies import StepToken
from mlxcore.testing.runtime import make_runtime

PROMPT = tuple(range(10, 30))


def run(rt, request: GenerationRequest, timeout: float = 60) -> tuple[list[int], FinishEvent]:
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    rt.engine.submit(request, events.put)
    tokens: list[int] = []
    while True:
        event = events.get(timeout=timeout)
        if isinstance(event, TokenEvent):
            tokens.extend(t.token for t in event.tokens)
        elif isinstance(event, FinishEvent):
            return tokens, event


def greedy(n: int = 12, **options) -> GenerationRequest:
    return GenerationRequest(PROMPT, n, options=options)


@pytest.fixture
def faulty(tiny_llama: Path) -> Iterator:
    rt = make_runtime(tiny_llama, "mlxcore.testing.faults", engine_max_restarts=2)
    yield rt
    rt.engine.shutdown(timeout=5)


def test_a_worker_thread_outlives_a_failing_job() -> None:
    def boom(stream) -> None:
        raise RuntimeError("boom")

    threads.run_job(boom).wait(timeout=10)
    ran = threading.Event()
    done = threads.run_job(lambda stream: ran.set())
    assert done.wait(timeout=10) and ran.is_set()


def test_an_engine_fault_fails_open_requests_and_restarts(faulty) -> None:
    reference, finish = run(faulty, greedy())
    assert finish.reason == "length"
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    faulty.engine.submit(greedy(200), events.put)  # an ordinary request beside the fault
    _, finish = run(faulty, greedy(**{"fault": "decoder-remove:raise"}))
    assert finish.reason == "error" and finish.code == UNAVAILABLE
    while not isinstance(last := events.get(timeout=10), FinishEvent):
        pass
    assert last.reason == "error" and last.code == UNAVAILABLE
    ok, state, reason = faulty.engine.health()
    assert not ok and state == "restarting" and "engine fault" in reason
    with pytest.raises(EngineUnavailable):
        faulty.engine.submit(greedy(), lambda e: None)
    time.sleep(2.1)  # the back-off
    assert faulty.engine.health()[0]
    again, finish = run(faulty, greedy())
    assert again == reference and finish.reason == "length"
    assert faulty.engine.stats()["engine_restarts"] == 1


def test_past_its_restarts_the_engine_fails_for_good(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama, "mlxcore.testing.faults", engine_max_restarts=0)
    try:
        _, finish = run(rt, greedy(**{"fault": "decoder-remove:raise"}))
        assert finish.code == UNAVAILABLE
        ok, state, reason = rt.engine.health()
        assert not ok and state == "failed" and "no restarts left" in reason
        with pytest.raises(EngineUnavailable):
            rt.engine.submit(greedy(), lambda e: None)
    finally:
        rt.engine.shutdown(timeout=5)
    assert rt.engine.state == "failed"


def test_a_hung_step_is_abandoned_by_the_watchdog(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama, "mlxcore.testing.faults", engine_watchdog=1.0)
    try:
        started = time.monotonic()
        hung = attrs.evolve(greedy(**{"fault": "decoder:hang"}), request_id="hung-decode")
        _, finish = run(rt, hung, timeout=15)
        assert finish.code == UNAVAILABLE and time.monotonic() - started < 5
        assert rt.engine.restarts.faults["hang"] == 1
        stall = rt.engine.last_stall()  # the step is named, with its request
        assert stall is not None and stall.phase == "decode" and stall.ids == ("hung-decode",)
        assert "20 prompt tokens" in stall.requests[0] and stall.seconds >= 1.0
        time.sleep(2.1)
        tokens, finish = run(rt, greedy())
        assert finish.reason == "length" and len(tokens) == 12
        _, finish = run(rt, greedy(**{"fault": "prefill:hang"}), timeout=15)
        assert finish.code == UNAVAILABLE
        stall = rt.engine.last_stall()
        assert stall is not None and stall.phase == "prefill"
        assert stall.summary().startswith("prefill of ")
    finally:
        rt.engine.shutdown(timeout=5)


def test_an_abandoned_loop_sends_nothing_after_its_finishes(tiny_llama: Path) -> None:
    """Abandoning marks the loop first and then ends its requests: a token the hung
    thread sends once it wakes is dropped, the finishes from the abandoning thread go out."""
    rt = make_runtime(tiny_llama)
    try:
        run(rt, greedy())  # a loop exists
        loop = rt.engine._loop
        got: list[Event] = []
        handle = RequestHandle(10**6, greedy(), got.append)
        late = threading.Thread(target=loop.send, args=(handle, TokenEvent([StepToken(1)])))
        loop.abandon("test: hung", UNAVAILABLE)
        late.start()  # the hung thread's token, after the abandonment
        late.join()
        assert got == [] and loop.abandoned
        loop.send(handle, FinishEvent("error", Usage(), error="x"))  # the abandoning thread's
        assert [type(e) for e in got] == [FinishEvent]
    finally:
        rt.engine.shutdown(timeout=5)


def test_requests_waiting_past_the_queue_deadline_end_as_overloaded(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama, max_num_seqs=1, max_queue_wait=0.3)
    try:
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        rt.engine.submit(greedy(2000), events.put)
        _, finish = run(rt, greedy(), timeout=10)
        assert finish.reason == "error" and finish.code == OVERLOADED
        assert rt.engine.stats()["requests_expired_in_queue"] == 1
    finally:
        rt.engine.shutdown(timeout=5)


def test_shutdown_answers_the_waiting_and_refuses_new_requests(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama, max_num_seqs=1)
    running: queue.SimpleQueue[Event] = queue.SimpleQueue()
    waiting: queue.SimpleQueue[Event] = queue.SimpleQueue()
    rt.engine.submit(greedy(40), running.put)
    first = running.get(timeout=30)  # it runs
    rt.engine.submit(greedy(40), waiting.put)
    rt.engine.shutdown(timeout=10)
    finish = waiting.get(timeout=1)
    assert isinstance(finish, FinishEvent) and finish.code == UNAVAILABLE
    last = first
    while not isinstance(last, FinishEvent):
        last = running.get(timeout=1)
    assert last.reason == "length"  # the running request was let finish
    with pytest.raises(EngineUnavailable):
        rt.engine.submit(greedy(), lambda e: None)


def test_a_broken_global_random_state_does_not_reach_requests(tiny_llama: Path) -> None:
    """mlx-lm's compiled top-k, traced with a bad k, leaves MLX's global random state
    broken; requests draw from their own keys, so sampling still works."""
    from mlx_lm.sample_utils import apply_top_k

    rt = make_runtime(tiny_llama)
    try:
        with pytest.raises(ValueError):
            apply_top_k(mx.zeros((1, 8)), 100)
        sampled = GenerationRequest(PROMPT, 8, SamplingParams(temperature=1.0, top_k=10**6))
        tokens, finish = run(rt, sampled)
        assert finish.reason == "length" and len(tokens) == 8
        repair_random_state()
        mx.eval(mx.random.uniform())  # the repair the engine runs after a failed request
    finally:
        mx.random.seed(0)
        rt.engine.shutdown(timeout=5)


def test_prefix_cache_entries_hold_only_their_own_tokens(tiny_llama: Path) -> None:
    """Entries taken out of a batch are copies: after eight requests decoded together
    finish, MLX's active memory is the weights plus what the prefix cache reports."""
    rt = make_runtime(tiny_llama, prefix_cache_size="64MB")
    try:
        done: list[queue.SimpleQueue[Event]] = []
        for i in range(8):
            events: queue.SimpleQueue[Event] = queue.SimpleQueue()
            rt.engine.submit(GenerationRequest(tuple(range(10 + i, 200 + i)), 64), events.put)
            done.append(events)
        for events in done:
            while not isinstance(events.get(timeout=60), FinishEvent):
                pass
        time.sleep(2.5)  # idle: the engine gives MLX's buffer cache back
        stats = rt.engine.stats()
        held = mx.get_active_memory() - stats["memory_weights_bytes"]
        assert stats["prefix_cache_entries"] >= 8
        assert held <= stats["prefix_cache_bytes"] * 1.1 + 2**20, (held, stats)
    finally:
        rt.engine.shutdown(timeout=5)


def test_requests_wait_for_memory_and_prefix_entries_are_evicted_first(tiny_llama: Path) -> None:
    """With a budget that holds one request's cache (prompt + max_tokens), requests run
    one at a time, and the prefix cache gives its entries up for them."""
    rt = make_runtime(tiny_llama, prefix_cache_size="64MB")
    try:
        memory = rt.engine.memory
        one = (len(PROMPT) + 64) * memory.per_token
        memory.limit = memory.weights + memory.cache_limit + one + one // 2
        queues: list[queue.SimpleQueue[Event]] = []
        for i in range(4):
            events: queue.SimpleQueue[Event] = queue.SimpleQueue()
            rt.engine.submit(GenerationRequest(tuple(range(10 + i, 30 + i)), 64), events.put)
            queues.append(events)
        most = 0
        finished = 0
        while finished < 4:
            most = max(most, int(rt.engine.stats()["requests_running"]))
            for events in queues:
                while not events.empty():
                    if isinstance(events.get(), FinishEvent):
                        finished += 1
            time.sleep(0.005)
        assert most == 1
        stats = rt.engine.stats()
        assert stats["memory_kv_reserved_peak_bytes"] <= one
        # four finished requests were stored (the 64MB cache would keep them all); later
        # requests only fit after earlier entries were evicted for them
        assert stats["prefix_cache_entries"] < 4
    finally:
        rt.engine.shutdown(timeout=5)


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen3_5"])
def test_a_row_that_fails_every_decode_step_fails_alone(
    family: str, request: pytest.FixtureRequest
) -> None:
    """Eight requests decode together; one of them makes every step of a batch holding it
    raise. The engine retries without half of the batch until that one is alone: it fails,
    and the other seven finish with the tokens of a fault-free run (recurrent state
    included: their caches are taken out of the batch intact)."""
    from mlxcore.testing.runtime import assert_matches_mlx_lm, submit_together

    rt = make_runtime(request.getfixturevalue(family), "mlxcore.testing.faults")
    try:
        requests = [GenerationRequest(tuple(range(20 + i, 60 + 2 * i)), 12 + i) for i in range(8)]
        bad = 5
        requests[bad] = GenerationRequest(
            requests[bad].prompt_tokens, 12, options={"fault": "decoder:poison"}
        )
        results = submit_together(rt, requests)
        for i, (req, res) in enumerate(zip(requests, results, strict=True)):
            assert res.finish is not None
            if i == bad:
                assert res.finish.reason == "error" and "injected fault" in (res.finish.error or "")
            else:
                assert_matches_mlx_lm(rt, req, res)
        stats = rt.engine.stats()
        assert stats["decode_sequences_isolated"] == 1
        assert 1 <= stats["decode_step_failures"] <= 4  # halving 8: at most log2(8) + 1
        assert stats["engine_restarts"] == 0
    finally:
        rt.engine.shutdown()
