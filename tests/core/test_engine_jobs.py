"""Model jobs (embeddings) run by the engine: between the steps of a running batch, under
its memory budget, watched by its watchdog; a job that fails or hangs costs nothing else."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlxcore.embeddings import batches, embed_tokens, embedding_pieces, forward_bytes
from mlxcore.engine.engine import EngineOverloaded, EngineUnavailable
from mlxcore.engine.events import Event, FinishEvent, TokenEvent
from mlxcore.engine.jobs import JobCancelled
from mlxcore.engine.request import GenerationRequest
from mlxcore.testing.runtime import make_runtime

PROMPT = tuple(range(10, 30))
TEXTS = [[5, 6, 7, 8], [9, 10], list(range(40, 70))]


def start(rt, max_tokens: int) -> queue.SimpleQueue[Event]:
    events: queue.SimpleQueue[Event] = queue.SimpleQueue()
    rt.engine.submit(GenerationRequest(PROMPT, max_tokens), events.put)
    first = events.get(timeout=60)
    assert isinstance(first, TokenEvent)  # decoding now
    return events


def finish_of(events: queue.SimpleQueue[Event]) -> FinishEvent:
    while True:
        event = events.get(timeout=120)
        if isinstance(event, FinishEvent):
            return event


def test_an_embedding_runs_between_the_steps_of_a_decoding_batch(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama)
    try:
        events = start(rt, 200)
        vectors = rt.embed(TEXTS, pooling="mean").future.result(timeout=60)
        stats = rt.engine.stats()
        assert stats["requests_running"] == 1  # the batch was not drained for it
        assert stats["embedding_jobs_completed"] == 1 and stats["jobs_running"] == 0
        finish = finish_of(events)
        assert finish.reason == "length" and finish.usage.completion_tokens == 200
        # on the engine's thread or not, the same vectors as a direct call
        assert vectors == embed_tokens(rt.model, TEXTS, pooling="mean")
        assert forward_bytes(rt.model, TEXTS) > 0
    finally:
        rt.engine.shutdown(timeout=5)


def test_a_job_waits_until_its_bytes_fit_and_counts_while_it_runs(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama)
    too_big = 10**15  # more than any budget beside a running request
    try:
        # long enough to outlast the check below on a fast machine (60 tokens of the tiny
        # model took under 0.3 s on a quiet day, and the job ran before the check)
        events = start(rt, 1000)
        seen: list[float] = []

        def job() -> str:
            stats = rt.engine.stats()
            seen.extend([stats["requests_running"], stats["memory_kv_reserved_bytes"]])
            return "ran"

        done = rt.engine.submit_job("embedding", job, too_big).future
        time.sleep(0.3)
        assert not done.done() and rt.engine.stats()["jobs_waiting"] == 1
        assert finish_of(events).reason == "length"
        assert done.result(timeout=30) == "ran"
        assert seen == [0, too_big]  # alone, and reserved while it ran
        assert rt.engine.stats()["memory_kv_reserved_bytes"] == 0
    finally:
        rt.engine.shutdown(timeout=5)


def test_a_failing_job_fails_alone(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama)
    try:
        events = start(rt, 40)

        def broken() -> None:
            raise ValueError("no body to embed with")

        with pytest.raises(ValueError, match="no body"):
            rt.engine.submit_job("embedding", broken, 1).future.result(timeout=30)
        assert finish_of(events).reason == "length"
        stats = rt.engine.stats()
        assert stats["embedding_jobs_failed"] == 1 and stats["engine_faults"] == 0
    finally:
        rt.engine.shutdown(timeout=5)


def test_a_hung_job_is_caught_by_the_watchdog(tiny_llama: Path) -> None:
    rt = make_runtime(tiny_llama, engine_watchdog=1.0)
    release = threading.Event()
    try:
        started = time.monotonic()
        hung = rt.engine.submit_job("embedding", lambda: release.wait(60), 1).future
        with pytest.raises(EngineUnavailable, match="no progress"):
            hung.result(timeout=15)
        assert time.monotonic() - started < 6
        assert rt.engine.restarts.faults["hang"] == 1
        time.sleep(2.1)  # the restart back-off
        assert len(rt.embed([[1, 2, 3]]).future.result(timeout=30)[0]) > 0
    finally:
        release.set()
        rt.engine.shutdown(timeout=5)


def test_jobs_past_the_queue_limit_are_refused_and_a_cancelled_one_never_runs(
    tiny_llama: Path,
) -> None:
    rt = make_runtime(tiny_llama, max_queue_size=2, engine_watchdog=0)
    release = threading.Event()
    ran: list[str] = []
    try:
        busy = rt.engine.submit_job("embedding", lambda: release.wait(30), 1).future
        deadline = time.monotonic() + 10
        while rt.engine.stats()["jobs_running"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        dropped = rt.engine.submit_job("embedding", lambda: ran.append("dropped"), 1)
        kept = rt.engine.submit_job("embedding", lambda: ran.append("kept"), 1).future
        with pytest.raises(EngineOverloaded, match="2 jobs waiting"):
            rt.engine.submit_job("embedding", lambda: None, 1)
        dropped.cancel()  # the client went away while it waited
        assert dropped.future.cancelled()
        release.set()
        assert busy.result(timeout=10) is True and kept.result(timeout=10) is None
        assert ran == ["kept"] and rt.engine.stats()["jobs_waiting"] == 0
    finally:
        release.set()
        rt.engine.shutdown(timeout=5)


def test_a_job_runs_a_piece_per_iteration_between_decode_steps_and_stops_when_cancelled(
    tiny_llama: Path,
) -> None:
    rt = make_runtime(tiny_llama)
    try:
        events = start(rt, 200)
        decoded: list[int] = []

        def pieces() -> Iterator[None]:
            for _ in range(4):
                decoded.append(rt.engine.stats()["prompt_tokens_processed"])
                decoded.append(events.qsize())  # tokens the running request got so far
                yield
            return "done"

        assert rt.engine.submit_job("embedding", pieces, 1).future.result(timeout=60) == "done"
        seen = decoded[1::2]
        assert seen == sorted(seen) and seen[-1] > seen[0]  # the batch decoded in between

        def forever() -> Iterator[None]:
            while True:
                yield

        endless = rt.engine.submit_job("embedding", forever, 1)
        time.sleep(0.2)
        endless.cancel()
        with pytest.raises(JobCancelled):
            endless.future.result(timeout=10)
        assert finish_of(events).reason == "length"
        stats = rt.engine.stats()
        assert stats["jobs_running"] == 0 and stats["embedding_jobs_failed"] == 1
        # an embedding of several forward passes (three batches of at most 8 tokens here)
        # is the same as one call of them all
        rows = [list(range(100, 106)), list(range(5, 10)), list(range(9, 13)), [7, 8]]
        pieces = rt.engine.submit_job(
            "embedding", lambda: embedding_pieces(rt.model, rows, batch_tokens=8), 1
        )
        assert len(batches(rows, 8)) == 3
        got, whole = pieces.future.result(timeout=60), embed_tokens(rt.model, rows)
        pairs = zip(got, whole, strict=True)
        assert max(abs(a - b) for g, w in pairs for a, b in zip(g, w, strict=True)) < 1e-5
    finally:
        rt.engine.shutdown(timeout=5)
