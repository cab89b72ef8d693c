"""The publisher's socket and queue: messages in the router's wire shape, a bounded
queue that turns into a resynchronisation, and clear refusals of bad settings."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import zmq

import mlxcore_kv_events.publisher as publisher_module
from mlxcore.engine.prefix_tree import PrefixTree
from mlxcore.testing.server import free_port
from mlxcore_kv_events.blocks import BlockMirror
from mlxcore_kv_events.publisher import EventPublisher, decode


def _receive(socket: zmq.Socket[bytes], want: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(events) < want and time.monotonic() < deadline:
        if socket.poll(100):
            frames = socket.recv_multipart()
            assert frames[0] == b"kv" and len(frames[1]) == 8
            _, _, batch, rank = decode(frames)
            assert rank is None
            events.extend(batch)
    return events


def _tree_with(mirror: BlockMirror, tokens: int) -> PrefixTree:
    tree = PrefixTree(lambda seg, at: (seg, seg), needs_snapshots=False)
    tree.watchers.append(mirror)
    tree.insert(np.arange(tokens), lambda start, stop: (None, stop - start))
    return tree


@pytest.fixture
def subscribed() -> Any:
    address = f"tcp://127.0.0.1:{free_port()}"
    publisher = EventPublisher(address, topic="kv")
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"kv")
    socket.connect(address)
    try:
        yield publisher, socket
    finally:
        socket.close(linger=0)
        publisher.close()


def test_changes_reach_a_subscriber_in_the_routers_shape(subscribed: Any) -> None:
    publisher, socket = subscribed
    assert _receive(socket, 1) == [{"type": "AllBlocksCleared"}]  # the resync on subscribe
    mirror = BlockMirror(publisher, 16)
    publisher.add(mirror)
    tree = _tree_with(mirror, 40)
    stored = _receive(socket, 1)
    assert [e["type"] for e in stored] == ["BlockStored"]
    event = stored[0]
    assert event["parent_block_hash"] is None and event["block_size"] == 16
    assert event["token_ids"] == list(range(32)) and len(event["block_hashes"]) == 2
    assert set(event) == {
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name",
    }  # fmt: skip
    tree.evict_entries(0)
    assert _receive(socket, 1) == [
        {"type": "BlockRemoved", "block_hashes": event["block_hashes"], "medium": "GPU"}
    ]
    mirror.cleared()
    assert _receive(socket, 1) == [{"type": "AllBlocksCleared"}]


def test_a_queue_past_its_bound_becomes_a_resynchronisation(
    subscribed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, socket = subscribed
    _receive(socket, 1)
    monkeypatch.setattr(publisher_module, "MAX_PENDING", 3)
    mirror = BlockMirror(publisher, 4)
    publisher.add(mirror)
    with publisher.lock:  # the thread cannot send meanwhile
        tree = PrefixTree(lambda seg, at: (seg, seg), needs_snapshots=False)
        tree.watchers.append(mirror)
        for start in range(0, 50, 10):
            tree.insert(np.arange(start, start + 10), lambda a, b: (None, b - a))
        assert publisher._resync and not publisher._pending
    events = _receive(socket, 6)
    assert events[0] == {"type": "AllBlocksCleared"}
    held = {h for e in events[1:] for h in e["block_hashes"]}
    assert held == {b.hash for b in mirror.held()} and len(held) == 10


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--kv-events-endpoint", "nonsense"], "--kv-events-endpoint nonsense"),
        (["--kv-events-endpoint", "tcp://*:1", "--kv-events-block-size", "0"], "block-size"),
    ],
)
def test_bad_settings_stop_the_start_with_a_clear_message(
    tiny_qwen3: Any, flags: list[str], message: str
) -> None:
    cmd = [sys.executable, "-m", "mlxcore", "serve", str(tiny_qwen3), "--port", "1", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert message in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
