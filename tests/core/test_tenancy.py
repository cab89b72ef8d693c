"""Tenants without a server: cache partitions (the ids a partition's prompts are keyed by,
and a real radix cache that never lets one partition resume from another's prefix),
fair admission across keys, stored responses per owner within a shared budget, and the
keys file read again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import pytest

from mlxcore.builtin.openai.responses.store import ResponseStore
from mlxcore.defaults.radix_cache import RadixPrefixCache
from mlxcore.engine.adapters import adapter_request
from mlxcore.engine.admission import FirstRow, admission_order, round_robin
from mlxcore.engine.cache_partition import (
    INT32_MIN,
    partition_markers,
    partition_name,
    partition_tokens,
)
from mlxcore.engine.events import RequestHandle
from mlxcore.engine.request import GenerationRequest
from mlxcore.errors import UsageError
from mlxcore.server.errors import APIError
from mlxcore.server.keys import KeyTable

# -- cache partitions ------------------------------------------------------------------


def test_a_partition_replaces_the_first_two_cache_tokens_with_its_own_ids() -> None:
    tokens = (151644, 872, 198, 9707)
    assert partition_tokens(tokens, None) == tokens
    alice = partition_tokens(tokens, partition_name("key:alice", None))
    bob = partition_tokens(tokens, partition_name("key:bob", None))
    salted = partition_tokens(tokens, partition_name("key:alice", "s1"))
    assert alice[2:] == bob[2:] == salted[2:] == tokens[2:]
    assert len({alice[:2], bob[:2], salted[:2]}) == 3
    for marker in (*alice[:2], *bob[:2], *salted[:2]):
        assert INT32_MIN <= marker < 0  # no token id; the disk tier stores it
    # deterministic (a restarted server finds its disk entries), and bound to the tokens
    assert partition_tokens(tokens, partition_name("key:alice", None)) == alice
    other_start = partition_tokens((1, *tokens[1:]), partition_name("key:alice", None))
    assert other_start[:2] != alice[:2]
    assert partition_tokens((5,), "p") == partition_markers("p", (5,))
    assert partition_name(None, None) is None
    # a scope and a salt cannot be confused for one another
    assert partition_name("key:a", None) != partition_name(None, "key:a")


def test_an_adapters_marker_stays_off_the_disk_under_a_partition() -> None:
    request = GenerationRequest((11, 12, 13, 14), cache_scope="key:alice")
    adapted = adapter_request(request, key=3)
    marker = adapted.cache_tokens[0]
    assert marker < INT32_MIN  # outside int32: never written to disk
    assert adapted.cache_tokens[1] < 0 and adapted.cache_tokens[2:] == (13, 14)
    assert adapted.cache_tokens != adapter_request(attrs.evolve(request, cache_scope=None), 3)
    # a draft's prefix store keys the same way, its own tokens after the prompt's head
    assert adapted.keyed([11, 12, 13, 14, 99]) == [*adapted.cache_tokens[:2], 13, 14, 99]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"], ids=["attention", "hybrid"])
def test_the_radix_cache_never_resumes_from_another_partitions_prefix(
    family: str, mlxcore_model_factory: Any
) -> None:
    """Segments and, on a hybrid model, recurrent snapshots alike."""
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(str(mlxcore_model_factory(family)))
    cache = RadixPrefixCache(model, size="100000")
    prompt = tuple(range(100, 164))
    alice = GenerationRequest(prompt, cache_scope="key:alice")
    state = make_prompt_cache(model)
    model(mx.array([list(prompt)]), cache=state)
    cache.store(alice.cache_tokens, state)
    longer = (*prompt, 7, 8)  # the next turn: it resumes where the stored one ended
    same = GenerationRequest(longer, cache_scope="key:alice")
    assert cache.lookup(same.cache_tokens).cached_tokens == len(prompt)
    for other in (
        GenerationRequest(longer, cache_scope="key:bob"),
        GenerationRequest(longer, cache_scope="key:alice", cache_salt="s"),
        GenerationRequest(longer),
    ):
        assert cache.lookup(other.cache_tokens).cached_tokens == 0


# -- fair admission --------------------------------------------------------------------


def waiting(*tenants: str | None, priority: int | None = None) -> list[RequestHandle]:
    out = []
    for i, tenant in enumerate(tenants):
        handle = RequestHandle(
            i, GenerationRequest((1, 2), 4, priority=priority, tenant=tenant), lambda e: None
        )
        handle.queued_at = float(i)
        out.append(handle)
    return out


def test_waiting_requests_are_taken_round_robin_across_keys() -> None:
    flood = waiting(*["a"] * 6, "b", "b", "c")
    order = [h.request.tenant for h in admission_order(flood, now=10.0, aging=5.0)]
    assert order == ["a", "b", "c", "a", "b", "a", "a", "a", "a"]
    # within a tenant, arrival order
    assert [h.uid for h in round_robin(flood) if h.request.tenant == "a"] == list(range(6))
    # one tenant (or none: no keys): arrival order untouched
    alone = waiting(*["a"] * 4)
    assert admission_order(alone, now=10.0, aging=5.0) == alone


def test_priorities_still_come_first_and_still_age() -> None:
    low = waiting("a", "a", "b", priority=1)
    high = waiting("c", priority=-1)[0]
    high.queued_at = 9.0
    order = admission_order([*low, high], now=10.0, aging=0.0)
    assert order[0] is high and [h.request.tenant for h in order[1:]] == ["a", "b", "a"]
    # aged 10 s at one level per 2 s, the low ones (1 - 5) beat the fresh high one
    aged = admission_order([*low, high], now=10.0, aging=2.0)
    assert aged[-1] is high


class _Loop:
    def __init__(self, tenants: list[str]) -> None:
        self.live = {i: _Live(t) for i, t in enumerate(tenants)}


class _Live:
    def __init__(self, tenant: str) -> None:
        self.handle: Any = waiting(tenant)[0]


def test_a_full_batch_takes_another_keys_first_row() -> None:
    loop = _Loop(["a"] * 8)  # key a holds every row of a batch of 8
    assert FirstRow.of(loop, waiting("a"), 8) is None  # one tenant: the batch is the bound
    rule = FirstRow.of(loop, waiting("b", "b", "c"), 8)
    assert rule is not None
    b = waiting("b")[0]
    assert rule.may_start(b, 0)
    rule.started(b)
    assert not rule.may_start(b, 1)  # its second waits for a free row (round-robin)
    assert not rule.may_start(waiting("a")[0], 1)  # a has rows running
    assert rule.may_start(waiting("c")[0], 1)
    assert not rule.may_start(waiting("c")[0], 2)  # at most 8 // 4 = 2 rows beyond 8
    low = waiting("d", priority=1)[0]  # less urgent than what runs: it waits for a row
    assert not rule.may_start(low, 0)
    assert rule.may_start(waiting("d", priority=-1)[0], 0)
    # keys that all have rows running share the batch by admission order alone
    balanced = FirstRow.of(_Loop(["a", "b"] * 4), waiting("a", "b"), 8)
    assert balanced is not None
    assert not balanced.may_start(waiting("a")[0], 0)
    assert not balanced.may_start(waiting("b")[0], 0)


# -- stored responses per owner --------------------------------------------------------


def turn(rid: str, size: int = 200) -> tuple[dict[str, Any], list[Any], list[Any]]:
    return {"id": rid}, [{"type": "message", "role": "user", "content": "x" * size}], []


def test_another_owners_id_is_a_plain_404() -> None:
    store = ResponseStore(max_bytes=10**6, ttl=0)
    store.put(*turn("r1"), None, owner="alice")
    assert store.get("r1", owner="alice").response["id"] == "r1"
    with pytest.raises(APIError) as theirs:
        store.get("r1", owner="bob")
    with pytest.raises(APIError) as nobodys:
        store.get("r2", owner="bob")
    assert theirs.value.status == nobodys.value.status == 404
    assert (
        theirs.value.body()
        == APIError(404, nobodys.value.message.replace("r2", "r1"), code=nobodys.value.code).body()
    )
    with pytest.raises(APIError):
        store.delete("r1", owner="bob")
    with pytest.raises(APIError):
        store.conversation("r1", "previous_response_id", owner="bob")
    assert len(store) == 1


def test_a_key_over_its_cap_evicts_its_own_oldest() -> None:
    one = sum(len(str(x)) for x in turn("r"))  # about one response's size
    store = ResponseStore(max_bytes=10**6, ttl=0, cap=lambda o: 3 * one if o == "a" else None)
    store.put(*turn("b1"), None, owner="b")
    for i in range(10):
        assert store.put(*turn(f"a{i}"), None, owner="a")
    assert store.owner_bytes("a") <= 3 * one
    assert store.get("a9", owner="a") and store.get("b1", owner="b")
    with pytest.raises(APIError):
        store.get("a0", owner="a")
    assert not store.put(*turn("huge", 10 * one), None, owner="a")  # beyond its cap


def test_a_full_store_evicts_from_the_key_that_holds_most() -> None:
    probe = ResponseStore(max_bytes=10**6, ttl=0)
    probe.put(*turn("x"), None)
    one = probe.bytes
    store = ResponseStore(max_bytes=10 * one, ttl=0)
    for i in range(3):
        store.put(*turn(f"b{i}"), None, owner="b")
    for i in range(30):  # a floods
        store.put(*turn(f"a{i}"), None, owner="a")
    assert store.bytes <= store.max_bytes
    for i in range(3):
        assert store.get(f"b{i}", owner="b")  # the small holder kept everything
    assert store.get("a29", owner="a")


# -- the keys file ---------------------------------------------------------------------


def test_roles_groups_limits_and_defaults_are_read(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(
        '[defaults]\nmax_concurrent = 4\nmax_stored_bytes = "1MB"\n'
        '[keys.ops]\nkey = "sk-ops"\nrole = "admin"\nmax_concurrent = 9\n'
        '[keys.a]\nkey = "sk-a"\ncache_group = "team"\nmax_file_bytes = 1000\n'
    )
    table = KeyTable.from_config(("sk-cli",), str(path))
    cli, ops, a = (table.find(s) for s in ("sk-cli", "sk-ops", "sk-a"))
    assert cli is not None and cli.is_admin and cli.cache_scope == "key:key0"
    assert ops is not None and ops.is_admin and ops.max_concurrent == 9
    assert ops.max_stored_bytes == 10**6
    assert a is not None and not a.is_admin and a.cache_scope == "group:team"
    assert (a.max_concurrent, a.max_file_bytes) == (4, 1000)
    for text, message in [
        ('[keys.a]\nkey = "k"\nrole = "owner"\n', "role must be one of"),
        ('[keys.a]\nkey = "k"\ncache_group = ""\n', "cache_group must be"),
        ('[keys.a]\nkey = "k"\nmax_stored_bytes = "lots"\n', "max_stored_bytes"),
        ('[defaults]\nkey = "k"\n[keys.a]\nkey = "k"\n', "per-key field"),
        ('[keys.a]\nkey = "k"\n[other]\nx = 1\n', "unknown table"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(UsageError, match=message):
            KeyTable.from_config((), str(bad))


def test_reading_the_file_again_keeps_counters_and_drops_removed_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text('[keys.a]\nkey = "sk-a"\n[keys.b]\nkey = "sk-b"\n')
    table = KeyTable.from_config(("sk-admin",), str(path))
    a = table.find("sk-a")
    assert a is not None and a.admit(0.0) == 0 and a.enter()
    path.write_text('[keys.a]\nkey = "sk-a2"\nmax_concurrent = 1\n[keys.c]\nkey = "sk-c"\n')
    assert table.reload() == (["c"], ["b"])
    assert table.find("sk-b") is None and table.find("sk-a") is None
    assert table.find("sk-a2") is a and a.counts["requests"] == 1  # the same key, counted
    assert not a.enter()  # its running request counts against the new limit
    assert table.find("sk-admin") is not None  # --api-key keys stay
    path.write_text("not toml [")
    with pytest.raises(UsageError, match="not TOML"):
        table.reload()
    assert table.find("sk-c") is not None  # a bad file leaves the keys in force
    path.write_text('[keys.x]\nkey = "sk-admin"\n')
    with pytest.raises(UsageError, match="given twice"):
        table.reload()
    without = KeyTable.from_config(("sk",), None)
    with pytest.raises(UsageError, match="no --api-keys-file"):
        without.reload()


def test_another_keys_request_starts_in_a_batch_one_key_fills(tiny_llama: Path) -> None:
    """Key a fills the batch (2 rows) and queues more; key b's request starts at once and
    ends long before a's first rows; a's queued ones wait for free rows."""
    import queue

    from mlxcore.engine.events import Event, FinishEvent, TokenEvent
    from mlxcore.engine.request import SamplingParams
    from mlxcore.testing.runtime import make_runtime

    rt = make_runtime(tiny_llama, max_num_seqs=2)

    def request(tenant: str, tokens: int) -> GenerationRequest:
        greedy = SamplingParams(temperature=0.0)
        return GenerationRequest((1, 2, 3, 4), tokens, greedy, tenant=tenant)

    order: list[str] = []
    try:
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        first: queue.SimpleQueue[Event] = queue.SimpleQueue()
        for i in range(5):
            rt.engine.submit(
                request("a", 300),
                lambda e, i=i: (
                    order.append(f"a{i}") if isinstance(e, FinishEvent) else first.put(e)
                ),
            )
        assert isinstance(first.get(timeout=60), TokenEvent)  # a's first rows run
        assert rt.engine.stats()["requests_waiting"] == 3
        rt.engine.submit(request("b", 4), events.put, lambda: order.append("b admitted"))
        while not isinstance(events.get(timeout=60), FinishEvent):
            pass
        order.append("b")
        assert order[:2] == ["b admitted", "b"], order  # no row of a finished before
        assert rt.engine.stats()["requests_running"] <= 2  # back within the batch
    finally:
        rt.engine.shutdown(timeout=5)


def test_a_newcomer_key_ends_an_opening_burst_and_is_prefilled_first_alone(
    tiny_llama: Path,
) -> None:
    """Key a's burst is prefilled batch after batch in one opening step, unless a key with
    nothing admitted waits (then the step ends after the first batch); while a's rows
    decode, key b's prompt is prefilled first, alone, ahead of a's pending ones."""
    from mlxcore.engine.events import Event, TokenEvent
    from mlxcore.engine.request import SamplingParams
    from mlxcore.testing.runtime import make_runtime

    rt = make_runtime(tiny_llama)
    greedy = SamplingParams(temperature=0.0)
    got: dict[int, list[Event]] = {}

    def handle(uid: int, tenant: str) -> RequestHandle:
        got[uid] = []
        request = GenerationRequest((1, 2, 3, uid % 50 + 4), 8, greedy, tenant=tenant)
        return RequestHandle(uid, request, got[uid].append)

    try:
        batch = rt.engine.config.prefill_batch_size
        for newcomer, left in ((set(), 0), ({"b"}, 12 - batch)):
            loop = rt.engine.new_loop()
            loop.iterate([handle(i, "a") for i in range(12)], None, lambda n=newcomer: n)
            assert len(loop.prefilling) == left, newcomer
            loop.fail_all("test over")
        loop = rt.engine.new_loop()
        loop.iterate([handle(100 + i, "a") for i in range(2)], None, set)
        assert not loop.prefilling and len(loop.decoder) == 2  # a's rows decode
        loop.iterate([handle(102, "a"), handle(103, "a"), handle(200, "b")], None, set)
        assert [live.handle.uid for live in loop.prefilling] == [102, 103]
        assert any(isinstance(e, TokenEvent) for e in got[200])  # b's first token is out
        assert not any(isinstance(e, TokenEvent) for e in got[102])
        loop.fail_all("test over")
    finally:
        rt.engine.shutdown(timeout=5)
