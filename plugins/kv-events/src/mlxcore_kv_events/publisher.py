"""vLLM's KV events on a ZMQ socket, for routers such as ``vllm-router --policy kv_aware``.

The wire, as vllm-router 0.1.17 reads it (``--kv-event-source WORKER=tcp://HOST:PORT``):
a PUB-side socket sends multipart messages ``[topic, seq, payload]``: ``seq`` an 8-byte
big-endian counter, ``payload`` msgpack of ``[timestamp, events, data_parallel_rank]``,
each event a map tagged by ``"type"``: ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium``,
``lora_name``), ``BlockRemoved`` (``block_hashes``, ``medium``) or ``AllBlocksCleared``.

The socket is an XPUB: each time a subscriber (a router starting, or reconnecting after
this server or the router restarted) subscribes, the thread sends ``AllBlocksCleared``
and then every block held, so a router never keeps blocks of an earlier life of this
server nor misses those stored before it connected. ``seq`` starts at the clock's
microseconds, so a restarted server's numbers still grow.

One thread owns the socket; the engines' threads only append events to a list under
:attr:`EventPublisher.lock`. The list is bounded: past :data:`MAX_PENDING` events
(a subscriber-less burst cannot happen, since PUB drops, but a stalled thread can) it is
dropped and replaced by a full resynchronisation.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import zmq

if TYPE_CHECKING:
    from mlxcore_kv_events.blocks import Block


class Mirror(Protocol):
    """What the publisher reads of each source of blocks: a prefix tree
    (:class:`~mlxcore_kv_events.blocks.BlockMirror`) or a slower tier behind one
    (:class:`~mlxcore_kv_events.tiers.TierMirror`)."""

    medium: str
    block_size: int

    def holds(self) -> bool:
        """Whether any block is held."""
        ...

    def chains(self) -> list[list[Block]]:
        """Every block held, as chains (parents first)."""
        ...


log = logging.getLogger("mlxcore.plugins.kv_events")

MAX_PENDING = 65536
"""Events kept for the thread at most; past it, a full resynchronisation instead."""

EVENTS_PER_MESSAGE = 512
"""Events per message of a resynchronisation."""

POLL_MS = 20
"""How long the thread waits for a subscriber between looks at the queue."""

TIER_POLL_SECONDS = 1.0
"""How often the thread reads the slower tiers (the disk) for changes."""


class EventPublisher:
    """The socket, its thread and the queue of events (see the module docstring).

    Args:
        endpoint: a ZMQ address to bind (``tcp://*:5557``).
        topic: the topic frame of every message (routers subscribe to a prefix of it).
    """

    def __init__(self, endpoint: str, topic: str = "") -> None:
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.lock = threading.RLock()
        self.mirrors: list[Mirror] = []
        self._tier_counts: dict[str, dict[int, int]] = {}
        self._pending: list[dict[str, Any]] = []
        self._resync = False
        self._seq = time.time_ns() // 1000
        self._closed = threading.Event()
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = context.socket(zmq.XPUB)
        self._socket.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)  # errors reach the caller: a clear start-up failure
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # what a shutdown queued (the caches cleared) goes out

    # -- called by the mirrors, holding the lock ------------------------------------

    def add(self, mirror: Mirror) -> None:
        """Publish ``mirror``'s changes from now on."""
        with self.lock:
            self.mirrors.append(mirror)

    def detach(self, mirror: Mirror) -> None:
        """Stop reading ``mirror`` (its blocks already taken back)."""
        if mirror in self.mirrors:
            self.mirrors.remove(mirror)

    def tier_counts(self, medium: str) -> dict[int, int]:
        """The block counts every slower tier's mirror of ``medium`` shares."""
        return self._tier_counts.setdefault(medium, {})

    def stored(self, blocks: list[Block], block_size: int, medium: str) -> None:
        """A chain of new blocks (each the parent of the next) in ``medium``."""
        self._put(_stored(blocks, block_size, medium))

    def removed(self, hashes: list[int], medium: str) -> None:
        """Blocks no longer held in ``medium``."""
        self._put({"type": "BlockRemoved", "block_hashes": hashes, "medium": medium})

    def cleared(self, mirror: Mirror, hashes: list[int]) -> None:
        """``mirror``'s blocks are gone for good: ``AllBlocksCleared`` when it was the
        only one with blocks, else its blocks removed."""
        if mirror in self.mirrors:
            self.mirrors.remove(mirror)
        if any(m.holds() for m in self.mirrors):
            if hashes:
                self.removed(hashes, mirror.medium)
        else:
            self._put({"type": "AllBlocksCleared"})

    def _put(self, event: dict[str, Any]) -> None:
        if self._resync:
            return  # the resynchronisation will state it
        self._pending.append(event)
        if len(self._pending) > MAX_PENDING:
            log.warning("kv-events: %d events queued; resynchronising instead", MAX_PENDING)
            self._pending.clear()
            self._resync = True

    # -- the thread ------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread and close the socket (what is queued is sent first)."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        next_poll = 0.0
        try:
            while not self._closed.is_set():
                if self._socket.poll(POLL_MS, zmq.POLLIN):
                    message = self._socket.recv()
                    if message[:1] == b"\x01":
                        with self.lock:
                            self._resync = True
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + TIER_POLL_SECONDS
                    self.poll_tiers()
                self._flush()
            self._flush()
        except Exception:
            log.exception("kv-events: the publisher thread failed; no more events are sent")
        finally:
            self._socket.close(linger=0)

    def poll_tiers(self) -> None:
        """Read the slower tiers for changes (the thread does it each second; each
        mirror takes the lock itself, after hashing what is new)."""
        with self.lock:
            mirrors = list(self.mirrors)
        for mirror in mirrors:
            poll = getattr(mirror, "poll", None)
            if poll is not None:
                poll()

    def _flush(self) -> None:
        with self.lock:
            if self._resync:
                self._resync = False
                self._pending.clear()
                batches = self._snapshot()
            elif self._pending:
                batches = [self._pending]
                self._pending = []
            else:
                return
        for events in batches:
            self._send(events)

    def _snapshot(self) -> list[list[dict[str, Any]]]:
        """``AllBlocksCleared`` then every held block, parents first (under the lock)."""
        chains = sorted(
            (
                (blocks[0].end, blocks, mirror.block_size, mirror.medium)
                for mirror in self.mirrors
                for blocks in mirror.chains()
            ),
            key=lambda chain: chain[0],
        )
        events: list[dict[str, Any]] = [{"type": "AllBlocksCleared"}]
        sent: set[tuple[str, int]] = set()  # two mirrors of one tier, during a restart
        for _, blocks, size, medium in chains:
            run = [b for b in blocks if (medium, b.hash) not in sent]
            sent.update((medium, b.hash) for b in run)
            if run:
                events.append(_stored(run, size, medium))
        return [
            events[i : i + EVENTS_PER_MESSAGE] for i in range(0, len(events), EVENTS_PER_MESSAGE)
        ]

    def _send(self, events: list[dict[str, Any]]) -> None:
        payload = msgpack.packb([time.time(), events, None])
        self._seq += 1
        try:
            self._socket.send_multipart(
                [self.topic, self._seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK
            )
        except zmq.Again:
            log.debug("kv-events: a subscriber is too slow; a message was dropped")


def decode(frames: list[bytes]) -> tuple[int, float, list[dict[str, Any]], int | None]:
    """One message as a subscriber reads it: ``(seq, timestamp, events, rank)``
    (for tests and for watching a replica's events by hand)."""
    _topic, seq, payload = frames
    stamp, events, rank = msgpack.unpackb(payload)
    return int.from_bytes(seq, "big"), float(stamp), list(events), rank


def _stored(blocks: list[Block], block_size: int, medium: str) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": [b.hash for b in blocks],
        "parent_block_hash": blocks[0].parent,
        "token_ids": [t for b in blocks for t in b.tokens],
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
    }
