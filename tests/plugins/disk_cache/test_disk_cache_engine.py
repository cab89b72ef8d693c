"""The disk tier through the real engine: a restart served from disk with greedy output
identical to cold (dense and hybrid models), damaged files, histories larger than memory,
a folder that goes away, the counters."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxcore.engine.request import GenerationRequest
from mlxcore.runtime import Runtime
from mlxcore.testing.runtime import Result, make_runtime, submit_together

HISTORY = tuple(range(30, 430))  # a 400-token conversation so far


@pytest.fixture
def runtimes() -> Iterator[Any]:
    made: list[Runtime] = []

    def make(model: Path, folder: Path | None, **config: Any) -> Runtime:
        if folder is None:
            rt = make_runtime(model, **config)
        else:
            options = {"disk_cache_dir": str(folder), "disk_cache_min_tokens": 64}
            rt = make_runtime(model, "disk-cache", plugin_options=options, **config)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        rt.engine.shutdown()


def run(rt: Runtime, prompt: tuple[int, ...], n: int = 8, **options: Any) -> Result:
    request = GenerationRequest(
        prompt, n, checkpoints=(len(HISTORY),), options={"explain_cache": True, **options}
    )
    (result,) = submit_together(rt, [request])
    assert result.finish is not None and result.finish.reason in ("stop", "length")
    return result


def explained(result: Result) -> dict[str, Any]:
    assert result.finish is not None
    cache: dict[str, Any] = result.finish.usage.extra["mlxcore"]["cache"]
    return cache


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_qwen3_5"])
def test_a_restart_is_served_from_disk_with_the_cold_answer(
    family: str, request: pytest.FixtureRequest, runtimes: Any, tmp_path: Path
) -> None:
    model: Path = request.getfixturevalue(family)
    first = runtimes(model, tmp_path)
    run(first, (*HISTORY, 1, 2, 3))
    first.engine.shutdown()  # writes what is queued

    turn = (*HISTORY, 5, 6, 7, 8)
    restarted = runtimes(model, tmp_path)
    warm = run(restarted, turn, n=16)
    cold = run(runtimes(model, None, prefix_cache_size="0"), turn, n=16)
    assert warm.tokens == cold.tokens
    info = explained(warm)
    assert info["source"] == "disk" and info["cached_tokens"] >= len(HISTORY)
    assert warm.finish is not None and warm.finish.usage.cached_tokens == info["cached_tokens"]
    stats = restarted.engine.stats()
    assert stats["prefix_cache_disk_reads"] == 1 and stats["prefix_cache_disk_enabled"] == 1
    # the same prompt again: a trimmable cache cuts the turn's stored sequence back;
    # recurrent state resumes at a snapshot, the history's (read from disk into memory)
    again = explained(run(restarted, turn))
    if family == "tiny_qwen3":
        assert (again["source"], again["cached_tokens"]) == ("memory", len(turn) - 1)
    else:
        assert (again["source"], again["cached_tokens"]) == ("memory", len(HISTORY))


def test_quantized_entries_go_to_their_own_folder_and_come_back_quantized(
    mlxcore_model_factory: Any, runtimes: Any, tmp_path: Path
) -> None:
    model = mlxcore_model_factory("qwen3", head_dim=32)
    int8 = {"kv_cache_dtype": "int8", "kv_group_size": 32}
    first = runtimes(model, tmp_path, **int8)
    run(first, (*HISTORY, 1, 2, 3))
    first.engine.shutdown()
    turn = (*HISTORY, 5, 6, 7, 8)
    plain = explained(run(runtimes(model, tmp_path), turn))
    assert plain["source"] != "disk"  # a full-precision server does not read int8 entries
    restarted = runtimes(model, tmp_path, **int8)
    warm = run(restarted, turn, n=16)
    cold = run(runtimes(model, None, prefix_cache_size="0", **int8), turn, n=16)
    assert explained(warm)["source"] == "disk"
    assert warm.tokens == cold.tokens
    assert len({p.parent for p in tmp_path.glob("*/*.safetensors")}) == 2


def test_a_damaged_entry_is_dropped_logged_and_computed(
    tiny_qwen3: Path, runtimes: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = runtimes(tiny_qwen3, tmp_path)
    run(first, (*HISTORY, 1))
    first.engine.shutdown()
    files = list(tmp_path.glob("*/*.safetensors"))
    assert files
    for data in files:
        raw = bytearray(data.read_bytes())
        raw[-100] ^= 0x55
        data.write_bytes(bytes(raw))
    turn = (*HISTORY, 9, 9)
    with caplog.at_level(logging.WARNING, logger="mlxcore.plugins.disk_cache"):
        served = run(runtimes(tiny_qwen3, tmp_path), turn)
    cold = run(runtimes(tiny_qwen3, None, prefix_cache_size="0"), turn)
    assert served.tokens == cold.tokens
    assert served.finish is not None and served.finish.usage.cached_tokens == 0
    assert "dropped a damaged entry" in caplog.text and "checksum" in caplog.text
    assert not list(tmp_path.glob("*/*.safetensors")) or all(
        f not in files for f in tmp_path.glob("*/*.safetensors")
    )


def test_histories_larger_than_memory_keep_hitting_from_disk(
    tiny_qwen3: Path, runtimes: Any, tmp_path: Path
) -> None:
    rt = runtimes(tiny_qwen3, tmp_path, prefix_cache_size="300")  # under one history
    sessions = [list(HISTORY), [t + 1000 for t in HISTORY]]
    for turn in range(3):
        for history in sessions:
            result = run(rt, (*history, 1, 2))
            rt.engine.cache.writer.flush(30)  # type: ignore[attr-defined]
            if turn:
                info = explained(result)
                assert info["source"] == "disk"
                assert info["cached_tokens"] >= 0.9 * (len(history) + 2)
            history += [1, 2, *result.tokens]


def test_a_folder_that_goes_away_turns_the_tier_off_once(
    tiny_qwen3: Path, runtimes: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "cache"
    rt = runtimes(tiny_qwen3, folder)
    shutil.rmtree(folder)
    with caplog.at_level(logging.WARNING, logger="mlxcore.plugins.disk_cache"):
        for i in range(3):
            run(rt, (*HISTORY, i))
            rt.engine.cache.writer.flush(30)  # type: ignore[attr-defined]
    assert caplog.text.count("turned off") == 1
    stats = rt.engine.stats()
    assert stats["prefix_cache_disk_enabled"] == 0
    again = run(rt, (*HISTORY, 0))  # still served, from memory
    assert explained(again)["source"] == "memory"


def test_a_side_request_after_a_restart_resumes_from_a_snapshot_on_disk(
    tiny_qwen3_5: Path, runtimes: Any, tmp_path: Path
) -> None:
    """A hybrid model's snapshot taken where a message starts goes to disk as a chained
    entry (its own tokens on top of its parent); after a restart a request that leaves
    the first one there resumes from it, with the cold answer."""
    first = runtimes(tiny_qwen3_5, tmp_path)
    message_start = 300
    main = GenerationRequest(
        (*HISTORY, 1, 2, 3), 8, checkpoints=(len(HISTORY),), boundaries=(message_start,)
    )
    submit_together(first, [main])
    first.engine.shutdown()
    entries = [json.loads(p.read_text()) for p in tmp_path.glob("*/*.json")]
    assert sorted(e["start"] for e in entries) == [0, message_start, len(HISTORY)]
    assert all((e["parent"] is None) == (e["start"] == 0) for e in entries)

    side = (*HISTORY[:350], *range(7000, 7040))
    restarted = runtimes(tiny_qwen3_5, tmp_path)
    warm = run(restarted, side, n=16)
    cold = run(runtimes(tiny_qwen3_5, None, prefix_cache_size="0"), side, n=16)
    assert warm.tokens == cold.tokens
    info = explained(warm)
    assert (info["source"], info["cached_tokens"], info["reason"]) == (
        "disk",
        message_start,
        "snapshot",
    )


def test_a_queued_request_reads_its_entry_ahead(
    tiny_qwen3: Path, runtimes: Any, tmp_path: Path
) -> None:
    """While a request waits for a slot, its entry's files are read on the prefetch
    thread; its lookup then takes them from memory, with the cold answer."""
    writer = runtimes(tiny_qwen3, tmp_path)
    run(writer, (*HISTORY, 1, 2, 3))
    writer.engine.shutdown()  # writes what is queued
    rt = runtimes(tiny_qwen3, tmp_path, max_num_seqs=1)
    busy = GenerationRequest(tuple(range(5000, 5100)), 48)
    queued = GenerationRequest((*HISTORY, 4, 5), 8, options={"explain_cache": True})
    occupying, waiting = Result(), Result()
    with rt.engine._wake:  # both queued in one go: the second waits for the first's slot
        rt.engine.submit(busy, occupying.sink)
        rt.engine.submit(queued, waiting.sink)
    assert occupying.done.wait(120) and waiting.done.wait(120)
    cold = run(runtimes(tiny_qwen3, None, prefix_cache_size="0"), (*HISTORY, 4, 5))
    assert waiting.tokens == cold.tokens
    assert explained(waiting)["source"] == "disk"
    stats = rt.engine.stats()
    assert stats["prefix_cache_disk_prefetches"] == 1
    assert stats["prefix_cache_disk_prefetch_hits"] >= 1


def test_a_history_that_outgrew_memory_reads_only_what_memory_lost(
    tiny_qwen3_5: Path, runtimes: Any, tmp_path: Path
) -> None:
    """A hybrid conversation stored with snapshots where its messages start, under a
    memory budget that keeps only its beginning: the next turn resumes from disk, reads
    the files past what memory still holds (memory's segments stand for the others) and
    answers as a cold server does."""
    history = tuple(range(30, 1230))
    rt = runtimes(tiny_qwen3_5, tmp_path, prefix_cache_size="700")
    main = GenerationRequest(
        (*history, 1, 2, 3), 8, checkpoints=(len(history),), boundaries=(300, 600, 900)
    )
    submit_together(rt, [main])
    rt.engine.cache.writer.flush(30)  # type: ignore[attr-defined]
    metas = (json.loads(p.read_text()) for p in tmp_path.glob("*/*.json"))
    entries = {e["start"]: e for e in metas}
    assert sorted(entries) == [0, 300, 600, 900, 1200]  # 1200: the finished sequence
    kept = rt.engine.cache.memory.longest(history)  # type: ignore[attr-defined]
    assert 300 <= kept < len(history)

    turn = (*history, 5, 6, 7, 8)
    warm = run(rt, turn, n=16)
    cold = run(runtimes(tiny_qwen3_5, None, prefix_cache_size="0"), turn, n=16)
    assert warm.tokens == cold.tokens
    info = explained(warm)
    assert (info["source"], info["cached_tokens"]) == ("disk", len(history))
    chain = [entries[start] for start in (0, 300, 600, 900)]  # the history's entry
    read = [e for e in chain if e["start"] + 300 > kept]
    assert len(read) < len(chain)
    stats = rt.engine.stats()
    assert stats["prefix_cache_disk_read_bytes"] == sum(e["nbytes"] for e in read)
