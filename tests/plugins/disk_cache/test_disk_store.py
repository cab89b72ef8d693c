"""The disk tier's store on real caches of real test models: round trips, prefix
matching, checksums, the size bound, sharing a folder, fingerprints."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlxcore.models.loader import load_model
from mlxcore_disk_cache.fingerprint import layout_of, model_fingerprint
from mlxcore_disk_cache.store import CorruptEntry, DiskStore, EntryGone


def filled(model: Any, tokens: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    model(mx.array(tokens)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def arrays(cache: list[Any]) -> list[np.ndarray]:
    return [
        np.array(a) for _, a in tree_flatten([c.state for c in cache]) if isinstance(a, mx.array)
    ]


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3: Path) -> Any:
    return load_model(tiny_qwen3).model


TOKENS = list(range(20, 220))


def test_an_entry_round_trips_and_is_found_by_prefix(qwen3: Any, tmp_path: Path) -> None:
    cache = filled(qwen3, TOKENS)
    store = DiskStore(tmp_path, 10**9)
    entry = store.write(TOKENS, cache, "checkpoint")
    assert entry is not None and entry.length == 200
    assert store.write(TOKENS, cache, "checkpoint") is None  # already there

    other = DiskStore(tmp_path, 10**9)  # a second server on the same folder
    other.refresh()
    prompt = np.asarray([*TOKENS[:150], 7, 8, 9], dtype=np.int32)
    match = other.closest(prompt, trimmable=True)
    assert match.entry is not None and (match.usable, match.shared) == (150, 150)
    whole = other.closest(prompt, trimmable=False)  # recurrent state: only whole entries
    assert whole.entry is None and whole.shared == 150
    longer = np.asarray([*TOKENS, 1, 2], dtype=np.int32)
    assert other.closest(longer, trimmable=False).usable == 200

    loaded = other.read(match.entry)
    for got, want in zip(arrays(loaded), arrays(cache), strict=True):
        np.testing.assert_array_equal(got, want)
    assert [type(c) for c in loaded] == [type(c) for c in cache]


def test_a_damaged_file_is_detected_and_deleted(qwen3: Any, tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 10**9)
    entry = store.write(TOKENS, filled(qwen3, TOKENS), "sequence")
    assert entry is not None
    data = tmp_path / entry.data
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptEntry, match="checksum"):
        store.read(entry)
    assert not data.exists() and not list(tmp_path.glob("*.json"))

    entry = store.write(TOKENS, filled(qwen3, TOKENS), "sequence")
    assert entry is not None
    (tmp_path / entry.data).write_bytes(b"")  # truncated
    with pytest.raises(CorruptEntry):
        store.read(entry)

    entry = store.write(TOKENS, filled(qwen3, TOKENS), "sequence")
    assert entry is not None
    (tmp_path / entry.data).unlink()  # another server evicted it
    with pytest.raises(EntryGone):
        store.read(entry)


def test_the_folder_keeps_to_its_size_least_recently_used_first(qwen3: Any, tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 10**9)
    prompts = [[p, *TOKENS[1:]] for p in (1, 2, 3)]
    entries = [store.write(t, filled(qwen3, t), "sequence") for t in prompts[:2]]
    assert all(e is not None for e in entries)
    one = entries[0]
    assert one is not None
    store.max_bytes = int(one.nbytes * 2.5)
    import os
    import time

    os.utime(tmp_path / f"{entries[1].key}.json", (time.time() - 60, time.time() - 60))  # type: ignore[union-attr]
    store.touch(one)  # used recently: the second one is the oldest now
    store.write(prompts[2], filled(qwen3, prompts[2]), "sequence")
    assert store.enforce_size() == 1
    store.refresh()
    kept = sorted(int(e.tokens[0]) for e in store.entries.values())
    assert kept == [1, 3]
    assert store.nbytes() <= store.max_bytes


def test_servers_sharing_a_folder_do_not_damage_it(qwen3: Any, tmp_path: Path) -> None:
    caches = {p: filled(qwen3, [p, *TOKENS]) for p in range(4)}
    stores = [DiskStore(tmp_path, 10**9) for _ in range(3)]
    errors: list[BaseException] = []

    def write(store: DiskStore) -> None:
        try:
            for p, cache in caches.items():
                store.write([p, *TOKENS], cache, "sequence")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    reader = DiskStore(tmp_path, 10**9)
    reader.refresh()
    assert len(reader.entries) == 4
    for entry in reader.entries.values():
        loaded = reader.read(entry)
        want = caches[int(entry.tokens[0])]
        for got, ref in zip(arrays(loaded), arrays(want), strict=True):
            np.testing.assert_array_equal(got, ref)
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_folder_that_cannot_be_created_is_an_os_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        DiskStore(blocker / "cache", 10**9)


def test_fingerprints_bind_entries_to_the_model(
    tiny_qwen3: Path, tiny_llama: Path, qwen3: Any
) -> None:
    layout = layout_of(make_prompt_cache(qwen3))
    same = model_fingerprint(tiny_qwen3, qwen3, layout)
    assert same == model_fingerprint(tiny_qwen3, qwen3, layout)
    llama = load_model(tiny_llama).model
    assert model_fingerprint(tiny_llama, llama, layout_of(make_prompt_cache(llama))) != same
    assert model_fingerprint(tiny_qwen3, qwen3, [*layout[:-1], "QuantizedKVCache{}"]) != same
    half = load_model(tiny_qwen3).model
    half.set_dtype(mx.float16)
    assert model_fingerprint(tiny_qwen3, half, layout) != same


def test_a_longer_entry_replaces_its_prefixes_for_trimmable_caches(
    qwen3: Any, tmp_path: Path
) -> None:
    store = DiskStore(tmp_path, 10**9)
    short = store.write(TOKENS[:100], filled(qwen3, TOKENS[:100]), "checkpoint")
    other = store.write([1, *TOKENS[1:50]], filled(qwen3, [1, *TOKENS[1:50]]), "sequence")
    long = store.write(TOKENS, filled(qwen3, TOKENS), "sequence")
    assert short is not None and other is not None and long is not None
    assert store.drop_prefixes_of(long) == 1
    store.refresh()
    assert sorted(e.length for e in store.entries.values()) == [50, 200]
    assert not (tmp_path / short.data).exists()
